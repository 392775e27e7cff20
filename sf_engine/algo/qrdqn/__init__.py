"""QR-DQN (--algo qrdqn) on the shared-memory replay buffer (learning.py); its spec (spec.py) is all the engine knows
of it, its flags (the qrdqn group) included."""
