"""The networks: the actor-critic, its encoders (MLP, CNNs), recurrent cores, action distributions, the model's
shape decisions and the compiled CPU kernels' Python side. Imports nothing of the runtime or the roles.
"""
