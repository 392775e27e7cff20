"""What the engine knows of SAC: its spec (sf_engine.config.algorithms) and its flags (the `sac` group)."""

from __future__ import annotations

from dataclasses import dataclass

from sf_engine.config.algorithms import TRANSITIONS, AlgorithmSpec, bounded_actions
from sf_engine.config.fields import ConfigError
from sf_engine.config.fields import flag_field as _f


@dataclass(frozen=True)
class SACConfig:
    alpha: float = _f(
        1.0,
        "--algo sac: the entropy temperature (the weight of the policy's entropy in its objective) at the start; "
        "tuned from there toward --target_entropy with --tune_alpha, else fixed.",
    )
    tune_alpha: bool = _f(
        True, "--algo sac: tune the temperature by gradient steps so that the policy's entropy nears its target."
    )
    target_entropy: float = _f(
        -1.0,
        "--algo sac: the entropy the temperature is tuned toward, per action dimension (SAC's -1: a target of "
        "-dims in all).",
    )
    critic_learning_rate: float = _f(
        0.0,
        "--algo sac: Adam's learning rate of the critics and the temperature (CleanRL's q_lr); 0: --learning_rate, "
        "as in Stable-Baselines3. The actor keeps --learning_rate; --lr_schedule decays both alike.",
    )


def check(cfg) -> None:
    """Its flags' values: a one-line ConfigError each."""
    if cfg.sac.alpha <= 0:
        raise ConfigError(f"--alpha must be positive (got {cfg.sac.alpha})")
    if cfg.sac.critic_learning_rate < 0:
        raise ConfigError(f"--critic_learning_rate must be >= 0 (got {cfg.sac.critic_learning_rate})")


# Stable-Baselines3's (and RL Zoo's MuJoCo) SAC: 256 x 2 ReLU, Adam 3e-4, batch 256, targets moved by 0.005 each
# update; but one update per 4 env steps (a replay ratio of 64, SB3's is 256: one per env step) and CleanRL's 1e-3 for
# the critics and the temperature. The learner binds on two cores, and more env steps per update learn more from the
# same updates: HalfCheetah-v5 after 15 minutes 7,079 at 64, 6,545 at 128, 6,264 and 5,484 at 256, 5,866 at 32; at 64
# with the critics at 1e-3: 9,587 and 8,637, against SB3's 4,463 and 4,435 in the same runs (docs/sac.md#figures).
# TD3's defaults start from the same (sf_engine/algo/td3/spec.py).
OFF_POLICY_CONTINUOUS = {
    "hidden_size": 256,
    "activation": "relu",
    "adam_eps": 1e-8,
    "max_grad_norm": 0.0,
    "batch_size": 256,
    "replay_size": 1_000_000,
    "learning_starts": 10_000,
    "replay_ratio": 64.0,
    "n_step": 1,
    "target_tau": 0.005,
    "target_update_period": 1,
    "num_envs_per_worker": 4,
    "rollout": 16,
    "learner_threads": 2,  # the learner is the busy side: updates/s 108 on one thread, 192 on two
}

SPEC = AlgorithmSpec(
    learner="sf_engine.algo.sac.learning:SAC",
    description="soft actor-critic for Box action spaces on the replay buffer: a squashed Gaussian actor, twin "
    "critics, the entropy temperature tuned; see the sac group",
    data=TRANSITIONS,
    data_parallel=True,
    actions=("continuous",),
    images=False,
    embeddings=False,
    multi_agent=False,
    several_policies=False,
    recurrent="never",
    config=("sac", SACConfig),
    check=check,
    check_env=bounded_actions,
    defaults={None: OFF_POLICY_CONTINUOUS | {"learning_rate": 3e-4, "critic_learning_rate": 1e-3}},
)
