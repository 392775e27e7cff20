"""What the engine knows of PPO: its spec (sf_engine.config.algorithms). Its defaults per env family are the
families' own (sf_engine.envs.families: PPO's settings for each), but for the horizon it takes on Box2D's games."""

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
    # Box2D's games reward a landing or a finish line hundreds of steps away: RL Zoo's horizon of 0.999 and a small
    # entropy bonus (docs/environments.md#box2d)
    defaults={"box2d": {"gamma": 0.999, "gae_lambda": 0.95, "entropy_coeff": 0.01}},
)
