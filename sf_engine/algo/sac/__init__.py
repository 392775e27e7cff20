"""SAC (--algo sac): soft actor-critic on the shared-memory replay buffer (learning.py). Its spec (spec.py) is all
the engine knows of it, its flags (the sac group) included."""
