"""Learning algorithms as math and training state, apart from the process plumbing: advantage targets (GAE,
V-trace), losses, PPO, PBT's exploit and explore. Imports nothing of the runtime or the roles.
"""
