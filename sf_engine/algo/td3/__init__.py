"""TD3 (--algo td3; Fujimoto et al. 2018): twin critics, target policy smoothing, delayed actor updates and Gaussian
exploration noise, on the shared-memory replay buffer. Its spec (spec.py) is all the engine knows of it."""
