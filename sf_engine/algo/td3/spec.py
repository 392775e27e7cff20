"""What the engine knows of TD3: its spec (sf_engine.config.algorithms) and its flags (the `td3` group)."""

from __future__ import annotations

from dataclasses import dataclass

from sf_engine.algo.sac.spec import OFF_POLICY_CONTINUOUS
from sf_engine.config.algorithms import TRANSITIONS, AlgorithmSpec, bounded_actions
from sf_engine.config.fields import ConfigError
from sf_engine.config.fields import flag_field as _f


@dataclass(frozen=True)
class TD3Config:
    exploration_noise: float = _f(
        0.1,
        "--algo td3: the std of the Gaussian noise added to the actor's action when acting, as a fraction of half "
        "the action range (RL Zoo's 0.1).",
    )
    target_noise: float = _f(
        0.2, "--algo td3: target policy smoothing: the std of the noise on the target actor's action (TD3's 0.2)."
    )
    target_noise_clip: float = _f(0.5, "--algo td3: that noise is clipped to +- this (TD3's 0.5).")
    policy_delay: int = _f(
        2, "--algo td3: critic updates per update of the actor and the target networks (TD3's delayed updates: 2)."
    )


def check(cfg) -> None:
    """Its flags' values: a one-line ConfigError each."""
    t = cfg.td3
    if t.policy_delay < 1:
        raise ConfigError(f"--policy_delay must be at least 1 (got {t.policy_delay}): 1 moves the actor every update")
    for flag in ("exploration_noise", "target_noise", "target_noise_clip"):
        if getattr(t, flag) < 0:
            raise ConfigError(f"--{flag} must be >= 0 (got {getattr(t, flag)})")


SPEC = AlgorithmSpec(
    learner="sf_engine.algo.td3.learning:TD3",
    description="TD3 (Fujimoto et al. 2018) for continuous actions on the replay buffer: twin critics, target "
    "policy smoothing, delayed actor updates, Gaussian exploration",
    data=TRANSITIONS,
    data_parallel=True,
    actions=("continuous",),
    images=False,
    embeddings=False,
    multi_agent=False,
    several_policies=False,
    recurrent="never",
    config=("td3", TD3Config),
    check=check,
    check_env=bounded_actions,
    # Stable-Baselines3's TD3 with RL Zoo's MuJoCo settings (learning rate 1e-3, batch 256, targets moved by 0.005,
    # the noise above), on SAC's 256 x 2 ReLU networks and replay ratio (SB3's are 400 and 300, one update per env
    # step): the learner binds on two cores. Eight envs in one split: the sampling's CPU halved, 155,852 updates in 15
    # minutes on HalfCheetah-v5 instead of 106,723 at SAC's 4 envs in 2 splits, last evaluation 9,777 against 6,446
    # (docs/sac.md#td3)
    defaults={None: OFF_POLICY_CONTINUOUS | {"learning_rate": 1e-3, "num_envs_per_worker": 8, "worker_num_splits": 1}},
)
