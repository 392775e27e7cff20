"""The configuration: typed groups of flags, their checks, the command line built from them and saved config
files.
"""
