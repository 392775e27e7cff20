"""What the engine knows of CrossQ (--algo crossq): its spec and its flags (the `crossq` group). Written outside the
repository against sf_engine's public API, then moved here unchanged but for its imports."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sf_engine.config.algorithms import TRANSITIONS, AlgorithmSpec
from sf_engine.config.fields import ConfigError, flag_field


@dataclass(frozen=True)
class CrossQConfig:
    critic_hidden_size: int = flag_field(
        256,
        "--algo crossq: units of the critics' hidden layers; the actor's are --hidden_size. The paper's are 2048 wide, "
        "Stable-Baselines3-contrib's 1024: on two CPU cores 1024 makes 6 updates/s against 50 at 256.",
    )
    policy_delay: int = flag_field(
        3,
        "--algo crossq: critic updates per update of the actor and the temperature (CrossQ's 3).",
    )
    renorm_momentum: float = flag_field(
        0.01,
        "--algo crossq: the batch renormalization layers' running statistics move by this fraction each step.",
    )
    renorm_warmup_steps: int = flag_field(
        100_000,
        "--algo crossq: updates during which batch renormalization is plain batch normalization (r = 1, "
        "d = 0), then its corrections clipped to --renorm_r_max and --renorm_d_max.",
    )
    renorm_r_max: float = flag_field(3.0, "--algo crossq: the clip of batch renormalization's r.")
    renorm_d_max: float = flag_field(5.0, "--algo crossq: the clip of batch renormalization's d.")
    adam_beta1: float = flag_field(0.5, "--algo crossq: Adam's beta1 of every optimizer (CrossQ's 0.5).")
    initial_alpha: float = flag_field(1.0, "--algo crossq: the entropy temperature at the start (tuned).")
    target_entropy_per_dim: float = flag_field(
        -1.0,
        "--algo crossq: the entropy the temperature is tuned toward, per action dimension.",
    )


def check(cfg) -> None:
    """Its flags' values: a one-line ConfigError each."""
    c = cfg.crossq
    for flag in ("critic_hidden_size", "policy_delay"):
        if getattr(c, flag) < 1:
            raise ConfigError(f"--{flag} must be at least 1 (got {getattr(c, flag)})")
    if not 0.0 < c.renorm_momentum <= 1.0:
        raise ConfigError(f"--renorm_momentum must be within (0, 1] (got {c.renorm_momentum})")
    if c.renorm_r_max < 1.0 or c.renorm_d_max < 0.0 or c.renorm_warmup_steps < 0:
        raise ConfigError("--renorm_r_max must be >= 1, --renorm_d_max and --renorm_warmup_steps >= 0")
    if not 0.0 <= c.adam_beta1 < 1.0 or c.initial_alpha <= 0:
        raise ConfigError("--adam_beta1 must be within [0, 1) and --initial_alpha positive")


def check_env(cfg, env_spec) -> None:
    """CrossQ squashes its actions into the env's bounds."""
    if not all(map(math.isfinite, env_spec.action.low + env_spec.action.high)):
        raise ConfigError(
            f"--algo {cfg.learner.algo} squashes its actions into the env's bounds; {cfg.env.env} has unbounded Box "
            f"actions: give its action space finite low and high"
        )
    if env_spec.action_mask:
        raise ConfigError(f"--algo {cfg.learner.algo} takes no action masks; {cfg.env.env} has one")


# Stable-Baselines3-contrib's CrossQ: a 256 x 2 ReLU actor, 1024 x 2 critics, batch renormalization in both, Adam
# 1e-3 with beta1 0.5, batch 256, no target networks, the actor every 3 updates; one update per env step as SAC's
# replay ratio of 256 would be on this machine's learner, so the same ratio as our SAC's, 64. Compiled: its critics'
# loss, many small ops of the renormalization, makes about 1.45x the updates per second through torch.compile on the
# CPU (HalfCheetah after 15 minutes on two cores: 7,371 and 7,501 against 6,654 eager; docs/sac.md)
SPEC = AlgorithmSpec(
    learner="sf_engine.algo.crossq.learning:CrossQ",
    description="CrossQ (Bhatt et al. 2024) for Box action spaces on the replay buffer: SAC without target networks, "
    "batch renormalization in the critics and the actor, the current and next steps through the critics in one "
    "batch; see the crossq group",
    data=TRANSITIONS,
    actions=("continuous",),
    images=False,
    embeddings=False,
    multi_agent=False,
    several_policies=False,
    recurrent="never",
    normalize_input=False,
    config=("crossq", CrossQConfig),
    data_parallel=True,
    check=check,
    check_env=check_env,
    defaults={
        None: {
            "hidden_size": 256,
            "activation": "relu",
            "learning_rate": 1e-3,
            "adam_eps": 1e-8,
            "max_grad_norm": 0.0,
            "batch_size": 256,
            "replay_size": 1_000_000,
            "learning_starts": 5_000,
            "replay_ratio": 64.0,
            "n_step": 1,
            "num_envs_per_worker": 4,
            "rollout": 16,
            "learner_threads": 2,
            "compile": True,
        },
    },
)
