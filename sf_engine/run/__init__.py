"""A run from the command line to the end: the plan, auto sizing, the experiment directory, the runner, the
supervisor and serial mode.
"""
