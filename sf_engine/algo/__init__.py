"""Learning algorithms as math and training state, apart from the process plumbing: one folder per algorithm
(ppo/, dqn/, pqn/, r2d2/, sac/, td3/: its learning class and its spec), and what they share: the seam (base), the
typed batches, advantage and value targets, the Q-learning core, PBT's exploit and explore, the acting model's
builder. Imports nothing of the runtime or the roles.
"""
