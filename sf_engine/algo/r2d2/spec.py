"""What the engine knows of R2D2: its spec (sf_engine.config.algorithms); the replay and q groups hold its flags."""

from __future__ import annotations

from sf_engine.algo.dqn.spec import bootstrap_forwards
from sf_engine.config.algorithms import SEQUENCES, AlgorithmSpec
from sf_engine.config.fields import ConfigError


def check(cfg) -> None:
    if cfg.model.actor_critic == "separate":
        raise ConfigError("--actor_critic separate is PPO's: drop it with --algo r2d2 (a Q-network has one core)")


SPEC = AlgorithmSpec(
    learner="sf_engine.algo.r2d2.learning:R2D2",
    description="R2D2: the DQN family with a recurrent core (--rnn) on replayed sequences after a burn-in, value "
    "rescaling",
    data=SEQUENCES,
    data_parallel=True,
    actions=("discrete",),
    multi_agent=False,
    several_policies=False,
    recurrent="required",
    normalize_input=False,
    value_rescale=True,
    bootstrap_forwards=bootstrap_forwards,
    check=check,
    defaults={
        # R2D2's (Kapturowski et al. 2019): n-step 5, prioritized sequences (priority exponent 0.9, importance
        # 0.6), value rescaling, Adam eps 1e-3, sequences of 80 after a burn-in of 40, a GRU core by default
        None: {
            "rnn": "gru",
            "value_rescale": True,
            "prioritized": True,
            "per_alpha": 0.9,
            "per_beta": 0.6,
            "n_step": 5,
            "adam_eps": 1e-3,
            "max_grad_norm": 40.0,
            "batch_size": 64,
            "learning_rate": 1e-4,
            "gamma": 0.997,
            "target_update_period": 2_500,
            "replay_ratio": 1.0,
            "rollout": 120,
        },
        # sized so that CartPoleNoVel-v1 learns within minutes on a few cores: short sequences (its memory is a
        # step or two: velocities from positions), a small core, frequent target updates
        "classic": {
            "hidden_size": 64,
            "rnn_size": 64,
            "learning_rate": 1e-3,
            "gamma": 0.99,
            "n_step": 3,
            "batch_size": 32,
            "replay_sequence_length": 16,
            "burn_in": 8,
            "rollout": 64,
            "replay_size": 100_000,
            "learning_starts": 2_000,
            "replay_ratio": 4.0,
            "target_update_period": 100,
            "num_envs_per_worker": 16,
        },
        # as when the image and Doom families' defaults were PPO's (untuned for R2D2)
        "image": {"learner_threads": 2},
        "doom": {"rnn_size": 512, "weight_init": "unit", "learner_threads": 2},
        "atari": {
            "encoder": "nature_cnn",
            "rnn": "lstm",
            "rnn_size": 512,
            "replay_size": 200_000,
            "learning_starts": 20_000,
            "num_envs_per_worker": 16,
            "learner_threads": 2,
        },
    },
)
