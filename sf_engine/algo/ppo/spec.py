"""What the engine knows of PPO: its spec (sf_engine.config.algorithms). Its defaults per env family are the
families' own (sf_engine.envs.families: PPO's settings for each)."""

from __future__ import annotations

from sf_engine.config.algorithms import SLOTS, AlgorithmSpec

SPEC = AlgorithmSpec(
    learner="sf_engine.algo.ppo.learning:PPO",
    description="PPO's clipped objective on GAE targets, or on V-trace's with --with_vtrace",
    data=SLOTS,
    normalize_returns=True,
    vtrace=True,
    user_model=True,
    pbt=("learning_rate", "entropy_coeff", "gamma", "ppo_clip_ratio"),
)
