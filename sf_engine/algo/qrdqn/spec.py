"""What the engine knows of QR-DQN (--algo qrdqn): its spec and its flags (the `qrdqn` group). Written outside the
repository against sf_engine's public API, then moved here unchanged but for its imports."""

from __future__ import annotations

from dataclasses import dataclass

from sf_engine.algo.dqn.spec import bootstrap_forwards
from sf_engine.config.algorithms import TRANSITIONS, AlgorithmSpec
from sf_engine.config.fields import ConfigError, flag_field


@dataclass(frozen=True)
class QRDQNConfig:
    num_quantiles: int = flag_field(200, "--algo qrdqn: quantiles of each action's return distribution (QR-DQN's 200).")
    quantile_huber_kappa: float = flag_field(
        1.0, "--algo qrdqn: the quantile Huber loss's threshold kappa, where it turns linear (QR-DQN's 1)."
    )


def check(cfg) -> None:
    """Its flags' values: a one-line ConfigError each."""
    if cfg.qrdqn.num_quantiles < 1:
        raise ConfigError(f"--num_quantiles must be at least 1 (got {cfg.qrdqn.num_quantiles})")
    if cfg.qrdqn.quantile_huber_kappa <= 0:
        raise ConfigError(f"--quantile_huber_kappa must be positive (got {cfg.qrdqn.quantile_huber_kappa})")


def check_env(cfg, env_spec) -> None:
    if env_spec.action_mask:
        raise ConfigError(f"--algo {cfg.learner.algo} acts on every action: {cfg.env.env} masks some; use --algo dqn")


# DQN's settings for each family (its spec's), without the Huber threshold, with fewer quantiles on classic control
SPEC = AlgorithmSpec(
    learner="sf_engine.algo.qrdqn.learning:QRDQN",
    description="QR-DQN (Dabney et al. 2018): the distribution of each action's return as quantiles, trained by "
    "quantile regression on the replay buffer, acting epsilon-greedy on their mean; see the qrdqn group",
    data=TRANSITIONS,
    data_parallel=True,
    actions=("discrete",),
    multi_agent=False,
    several_policies=False,
    recurrent="never",
    normalize_input=False,
    bootstrap_forwards=bootstrap_forwards,
    config=("qrdqn", QRDQNConfig),
    check=check,
    check_env=check_env,
    defaults={
        None: {"max_grad_norm": 10.0, "adam_eps": 1e-5},
        "classic": {
            "num_quantiles": 25,
            "hidden_size": 64,
            "activation": "relu",
            "learning_rate": 2e-3,
            "lr_schedule": "linear",
            "lr_end": 1e-4,
            "lr_decay_env_steps": 500_000,
            "batch_size": 128,
            "replay_size": 100_000,
            "learning_starts": 1_000,
            "replay_ratio": 8.0,
            "target_update_period": 100,
            "num_envs_per_worker": 16,
            "rollout": 16,
            "layer_norm": True,
            "prioritized": True,
        },
        # Ape-X on Atari as DQN's; QR-DQN's Adam epsilon (0.01 / batch 32) and 200 quantiles
        "atari": {
            "learning_rate": 1e-4,
            "adam_eps": 3.125e-4,
            "batch_size": 32,
            "replay_size": 200_000,
            "learning_starts": 20_000,
            "replay_ratio": 1.0,
            "target_update_period": 2_000,
            "num_envs_per_worker": 16,
            "rollout": 32,
            "learner_threads": 2,
        },
    },
)
