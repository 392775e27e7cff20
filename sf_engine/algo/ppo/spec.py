"""What the engine knows of PPO: its spec (sf_engine.config.algorithms), with its settings for each env family and
for the envs that need their own."""

from __future__ import annotations

from dataclasses import dataclass

from sf_engine.config.algorithms import SLOTS, AlgorithmSpec, Range
from sf_engine.config.fields import ConfigError
from sf_engine.config.fields import flag_field as _f


@dataclass(frozen=True)
class PPOConfig:
    gae_lambda: float = _f(0.95, "GAE lambda (advantage estimation without V-trace).")
    ppo_clip_ratio: float = _f(0.2, "PPO clipping of the policy ratio to [1 - clip, 1 + clip].")
    value_loss_coeff: float = _f(0.5, "Weight of the value loss.")
    entropy_coeff: float = _f(0.0, "Weight of the entropy bonus.")
    with_vtrace: bool = _f(
        False, "Use V-trace targets and advantages (off-policy correction for policy lag) instead of GAE."
    )
    vtrace_rho_bar: float = _f(1.0, "V-trace: truncation of importance weights in the targets (rho_bar).")
    vtrace_c_bar: float = _f(1.0, "V-trace: truncation of the trace coefficients (c_bar).")


def check(cfg) -> None:
    """Its flags' values: a one-line ConfigError each."""
    p = cfg.ppo
    for flag in ("ppo_clip_ratio", "vtrace_rho_bar", "vtrace_c_bar"):
        if getattr(p, flag) <= 0:
            raise ConfigError(f"--{flag} must be positive (got {getattr(p, flag)})")
    for flag in ("value_loss_coeff", "entropy_coeff"):
        if getattr(p, flag) < 0:
            raise ConfigError(f"--{flag} must be >= 0 (got {getattr(p, flag)})")
    if not 0.0 <= p.gae_lambda <= 1.0:
        raise ConfigError(f"--gae_lambda must be within [0, 1] (got {p.gae_lambda})")


# PPO on the continuous family: CleanRL's and RL Zoo's MuJoCo settings (a 64 x 2 tanh network, both normalizers)
CONTINUOUS = {
    "activation": "tanh",
    "hidden_size": 64,
    "normalize_input": True,
    "normalize_returns": True,
    "rollout": 64,
    "batch_size": 1024,
    "num_batches_per_epoch": 4,
    "num_epochs": 5,
    "learning_rate": 3e-4,
    "lr_schedule": "constant",
    "entropy_coeff": 0.0,
}

DEFAULTS = {
    # minibatches of 256, one update per 64 samples as in Sample Factory's and CleanRL's Atari PPO: on Breakout-v5
    # it learned faster per env step and per second than 4 minibatches of 1,024 (docs/performance.md#pong-v5)
    "atari": {
        "rollout": 128,
        "batch_size": 256,
        "num_batches_per_epoch": 16,
        "num_epochs": 4,
        "learning_rate": 2.5e-4,
        "lr_schedule": "linear",
        "ppo_clip_ratio": 0.1,
        "entropy_coeff": 0.01,
        "learner_threads": 2,
    },
    "image": {
        "rollout": 128,
        "batch_size": 1024,
        "num_batches_per_epoch": 4,
        "num_epochs": 4,
        "learning_rate": 2.5e-4,
        "ppo_clip_ratio": 0.1,
        "entropy_coeff": 0.01,
        "learner_threads": 2,
    },
    # Sample Factory's Doom settings (its doom_override_defaults and APPO defaults): a GRU of 512 after its simple
    # conv encoder, rollouts of 32, one epoch over batches of 1,024, lr 1e-4, its per-pixel input normalization,
    # normalized returns, Adam's eps 1e-6, unit-gain init, and its value loss weight (its loss is 0.5 x squared error
    # without our 0.5 factor: 1.0 here)
    "doom": {
        "rnn": "gru",
        "rnn_size": 512,
        "rollout": 32,
        "batch_size": 1024,
        "num_batches_per_epoch": 1,
        "num_epochs": 1,
        "learning_rate": 1e-4,
        "ppo_clip_ratio": 0.1,
        "entropy_coeff": 0.001,
        "normalize_input": True,
        "normalize_returns": True,
        "max_grad_norm": 4.0,
        "value_loss_coeff": 1.0,
        "adam_eps": 1e-6,
        "weight_init": "unit",
        "learner_threads": 2,
    },
    # turn-based games (PettingZoo AEC, e.g. classic board games) in self-play: a wider MLP, a gentler learning rate
    # and an entropy bonus, without which self-play collapses onto one deterministic line of play; input
    # normalization, so that a board's 0/1 planes (stored as a uint8 image, seen by the small CNN) are not squashed to
    # 0..1/255 (docs/performance.md#several-agents-and-policies)
    "turns": {"hidden_size": 256, "learning_rate": 3e-4, "entropy_coeff": 0.05, "normalize_input": True},
    "continuous": CONTINUOUS,
    # Box2D's vector games: the continuous family's networks and normalizers, and for games that reward a landing or
    # a finish line hundreds of steps away RL Zoo's horizon of 0.999 and a small entropy bonus
    # (docs/environments.md#box2d)
    "box2d": CONTINUOUS | {"gamma": 0.999, "gae_lambda": 0.95, "entropy_coeff": 0.01},
    # a device env: the rollout device mode sizes (sf_engine.run.autosize), over the family's (on Playground's
    # CartpoleBalance, the continuous family's batch of 4,096: its 64 steps x 64 envs about 6,000 env steps/s, 16 x 256
    # a mean return of 950 in 39 s; docs/performance.md#device-envs)
    "device": {"rollout": "auto"},
    # CartPole without its velocities (envs.partially_observed): input normalization (the core must tell apart
    # position changes of a few thousandths), gamma 0.98, 4 epochs, learning rate 1e-3 with linear decay
    "CartPoleNoVel-v1": {
        "normalize_input": True,
        "gamma": 0.98,
        "num_epochs": 4,
        "learning_rate": 1e-3,
        "lr_schedule": "linear",
    },
}

SPEC = AlgorithmSpec(
    learner="sf_engine.algo.ppo.learning:PPO",
    description="PPO's clipped objective on GAE targets, or on V-trace's with --with_vtrace",
    data=SLOTS,
    normalize_returns=True,
    user_model=True,
    data_parallel=True,
    # the ranges its hyperparameters are drawn from and kept within (gamma's by its horizon 1 / (1 - gamma))
    pbt={
        "learning_rate": Range(1e-5, 1e-2),
        "entropy_coeff": Range(1e-4, 5e-2),
        "gamma": Range(0.9, 0.999, horizon=True),
        "ppo_clip_ratio": Range(0.05, 0.4),
    },
    config=("ppo", PPOConfig),
    check=check,
    defaults=DEFAULTS,
)
