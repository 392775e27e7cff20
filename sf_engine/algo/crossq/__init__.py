"""CrossQ (--algo crossq) on the shared-memory replay buffer (learning.py); its spec (spec.py) is all the engine knows
of it, its flags (the crossq group) included."""
