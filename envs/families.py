"""Flag defaults per env family (the families: envs.registry): the training settings each family starts
from, and the fewest envs per rollout worker that --num_envs_per_worker auto picks. The runner reads them
while it builds the run plan (sf_engine.config.cli.make_config puts them under the user's flags, which
always win).
"""

from __future__ import annotations

from .partially_observed import ENV_DEFAULTS
from .spec import EnvSpec

# --num_envs_per_worker auto uses at least this many (fewer envs make too few, too correlated samples)
ENVS_PER_WORKER_HINT = {"classic": 128, "atari": 32, "image": 16, "continuous": 32, "doom": 32, "turns": 128}

FAMILY_DEFAULTS = {
    "classic": {},
    # minibatches of 256, one update per 64 samples as in Sample Factory's and CleanRL's Atari PPO: on Breakout-v5
    # it learned faster per env step and per second than 4 minibatches of 1,024 (docs/performance.md#pong-v5)
    "atari": {
        "encoder": "nature_cnn",
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
    # Sample Factory's Doom settings (its doom_override_defaults and APPO defaults): its simple conv
    # encoder and a GRU of 512, rollouts of 32, one epoch over batches of 1,024, lr 1e-4, its
    # per-pixel input normalization, normalized returns, Adam's eps 1e-6, unit-gain init, and its value
    # loss weight (its loss is 0.5 x squared error without our 0.5 factor: 1.0 here)
    "doom": {
        "encoder": "convnet_simple",
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
    # turn-based games (PettingZoo AEC, e.g. classic board games) in self-play: a wider MLP, a gentler
    # learning rate and an entropy bonus, without which self-play collapses onto one deterministic line
    # of play; input normalization, so that a board's 0/1 planes (stored as a uint8 image, seen by the
    # small CNN) are not squashed to 0..1/255 (docs/performance.md#several-agents-and-policies)
    "turns": {"hidden_size": 256, "learning_rate": 3e-4, "entropy_coeff": 0.05, "normalize_input": True},
    "continuous": {
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
    },
}


# two-player turn-based games: the mean return of a zero-sum game stays 0 in self-play, so the evaluator plays 20
# games against a random player every 30 s (the win rate is what moves; about 0.15 s of one core each time on
# Connect Four; --eval_every_sec 0 turns it off)
TWO_PLAYER_DEFAULTS = {"eval_every_sec": 30.0, "eval_episodes": 20}


# the defaults of the algorithms other than PPO (--algo dqn, pqn, r2d2, sac): every family's (None), then a
# family's own; they replace the family's PPO settings above. No recurrent core (but R2D2's) and no normalization.
_VALUE_BASED = {"rnn": "none", "normalize_input": False, "normalize_returns": False, "lr_schedule": "constant"}
ALGO_DEFAULTS = {
    ("dqn", None): _VALUE_BASED | {"max_grad_norm": 10.0, "adam_eps": 1e-5},
    # tuned for CartPole's greedy 475 from launch (docs/value-based.md#figures): a small network makes about twice
    # the updates per second of a 256-wide one; with layer norm, a 2e-3 step and a target copied every 100
    # updates 17 of 20 runs got there within 12 s (11 by the first evaluation, 5 s into training), against 1 of
    # 5 with 256 units, 1e-3 and 250
    ("dqn", "classic"): {
        "hidden_size": 64,
        "activation": "relu",
        "learning_rate": 2e-3,
        "batch_size": 128,
        "replay_size": 100_000,
        "learning_starts": 1_000,
        "replay_ratio": 8.0,
        "target_update_period": 100,
        "num_envs_per_worker": 16,
        "rollout": 16,
        "layer_norm": True,
    },
    # Ape-X on Atari: Nature DQN's network and step sizes, and a replay ratio in Ape-X's regime (its actors
    # outpace its learner: far fewer samples trained per env step than Nature DQN's 8); --replay_ratio 8 is
    # Nature DQN's, at an eighth of the env steps per second where learning is the slower side (a CPU learner)
    ("dqn", "atari"): {
        "encoder": "nature_cnn",
        "learning_rate": 1e-4,
        "adam_eps": 1.5e-4,
        "batch_size": 32,
        "replay_size": 200_000,
        "learning_starts": 20_000,
        "replay_ratio": 1.0,
        "target_update_period": 2_000,
        "num_envs_per_worker": 16,
        "rollout": 32,
        "learner_threads": 2,
    },
    # CleanRL's pqn.py and pqn_atari_envpool.py
    ("pqn", None): _VALUE_BASED
    | {
        "layer_norm": True,
        "activation": "relu",
        "max_grad_norm": 10.0,
        "epsilon_start": 1.0,
        "epsilon_end": 0.05,
        "apex_alpha": 0.0,
        "num_epochs": 4,
        "num_batches_per_epoch": 4,
    },
    # Stable-Baselines3's (and RL Zoo's MuJoCo) SAC: 256 x 2 ReLU, Adam 3e-4, batch 256, targets moved by 0.005
    # each update; but one update per 4 env steps (a replay ratio of 64, SB3's is 256: one per env step) and
    # CleanRL's 1e-3 for the critics and the temperature. The learner binds on two cores, and more env steps per
    # update learn more from the same updates: HalfCheetah-v5 after 15 minutes 7,079 at 64, 6,545 at 128, 6,264
    # and 5,484 at 256, 5,866 at 32; at 64 with the critics at 1e-3: 9,587 and 8,637, against SB3's 4,463 and
    # 4,435 in the same runs (docs/sac.md#figures)
    ("sac", None): _VALUE_BASED
    | {
        "hidden_size": 256,
        "activation": "relu",
        "learning_rate": 3e-4,
        "critic_learning_rate": 1e-3,
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
    },
    # R2D2's (Kapturowski et al. 2019): n-step 5, prioritized sequences (priority exponent 0.9, importance 0.6),
    # value rescaling, Adam eps 1e-3, sequences of 80 after a burn-in of 40, a GRU core by default
    ("r2d2", None): _VALUE_BASED
    | {
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
    # sized so that CartPoleNoVel-v1 learns within minutes on a few cores: short sequences (its memory is a step
    # or two: velocities from positions), a small core, frequent target updates
    ("r2d2", "classic"): {
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
    ("r2d2", "atari"): {
        "encoder": "nature_cnn",
        "rnn": "lstm",
        "rnn_size": 512,
        "replay_size": 200_000,
        "learning_starts": 20_000,
        "num_envs_per_worker": 16,
        "learner_threads": 2,
    },
    ("pqn", "classic"): {"hidden_size": 128, "learning_rate": 2.5e-4, "epsilon_decay_env_steps": 250_000},
    ("pqn", "atari"): {
        "encoder": "nature_cnn",
        "learning_rate": 2.5e-4,
        "rollout": 32,
        "batch_size": 1024,
        "epsilon_end": 0.01,
        "epsilon_decay_env_steps": 1_000_000,
        "learner_threads": 2,
    },
}


def flag_defaults(env_id: str, spec: EnvSpec, algo: str = "ppo") -> dict:
    """{flag name: value}: the defaults of the env's family, then the env's own (ENV_DEFAULTS); with a
    --algo other than PPO, its own (ALGO_DEFAULTS) over the family's PPO settings."""
    two_player = TWO_PLAYER_DEFAULTS if spec.family == "turns" and len(spec.agents) == 2 else {}
    defaults = FAMILY_DEFAULTS[spec.family] | two_player | ENV_DEFAULTS.get(env_id, {})
    return defaults | ALGO_DEFAULTS.get((algo, None), {}) | ALGO_DEFAULTS.get((algo, spec.family), {})
