"""PPO (--algo ppo): the clipped objective on GAE or V-trace targets, over whole trajectory slots (learning.py, its
losses in loss.py). Its spec (spec.py) is all the engine knows of it."""
