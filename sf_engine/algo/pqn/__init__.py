"""PQN (--algo pqn): Q(lambda) targets over each batch of trajectory slots, no replay, no target network
(learning.py). Its spec (spec.py) is all the engine knows of it."""
