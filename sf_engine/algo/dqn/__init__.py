"""DQN (--algo dqn): double Q, dueling heads, n-step returns on the shared-memory replay buffer (learning.py). Its
spec (spec.py) is all the engine knows of it."""
