"""Flag defaults per env family (the families: envs.registry): the training settings each family starts
from, and the fewest envs per rollout worker that --num_envs_per_worker auto picks. The runner reads them
while it builds the run plan (sf_engine.config.cli.make_config puts them under the user's flags, which
always win).
"""

from __future__ import annotations

from .partially_observed import ENV_DEFAULTS
from .spec import EnvSpec

# --num_envs_per_worker auto uses at least this many (fewer envs make too few, too correlated samples)
ENVS_PER_WORKER_HINT = {
    "classic": 128,
    "atari": 32,
    "image": 16,
    "continuous": 32,
    "box2d": 32,
    "doom": 32,
    "turns": 128,
}

# Box2D's games (Gymnasium's box2d envs; EnvPool steps the same ids in C++): the box2d family where they observe
# vectors (CarRacing's 96x96 colour frames take the image family's)
BOX2D_GAMES = ("LunarLander", "LunarLanderContinuous", "BipedalWalker", "BipedalWalkerHardcore", "CarRacing")


def game_name(env_id: str) -> str:
    """An env id's name without its module, namespace or version (`gymnasium:ALE/Breakout-v5`: `Breakout`)."""
    return env_id.split(":")[-1].split("/")[-1].rsplit("-v", 1)[0]


def is_box2d(env_id: str) -> bool:
    """Whether `env_id` is one of Box2D's games, of any version (`LunarLander-v3`, `gymnasium:BipedalWalker-v3`)."""
    return game_name(env_id) in BOX2D_GAMES


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

# Box2D's vector games (LunarLander, LunarLanderContinuous, BipedalWalker): the continuous family's networks and
# normalizers; PPO's longer horizon for them is its own (sf_engine/algo/ppo/spec.py: the off-policy family keeps 0.99)
FAMILY_DEFAULTS["box2d"] = FAMILY_DEFAULTS["continuous"]


# two-player turn-based games: the mean return of a zero-sum game stays 0 in self-play, so the evaluator plays 20
# games against a random player every 30 s (the win rate is what moves; about 0.15 s of one core each time on
# Connect Four; --eval_every_sec 0 turns it off)
TWO_PLAYER_DEFAULTS = {"eval_every_sec": 30.0, "eval_episodes": 20}


# a device env (envs.device): its sampler steps the whole batch at once, one slot per rollout (no double buffering),
# its rollout sized by device mode (sf_engine.run.autosize: short, so that an on-policy batch is many envs wide, as a
# step of the batch costs about the same for more envs) over the family's (PPO on Playground's CartpoleBalance, the
# continuous family's batch of 4,096: its 64 steps x 64 envs about 6,000 env steps/s, 16 x 256 a mean return of 950
# in 39 s; docs/performance.md#device-envs)
DEVICE_DEFAULTS = {"worker_num_splits": 1, "rollout": "auto"}


def flag_defaults(env_id: str, spec: EnvSpec) -> dict:
    """{flag name: value}: the defaults of the env's family, then a device env's, then the env's own (ENV_DEFAULTS).
    They are PPO's settings for the family; another algorithm's own defaults for it (its spec's) go over them."""
    two_player = TWO_PLAYER_DEFAULTS if spec.family == "turns" and len(spec.agents) == 2 else {}
    device = DEVICE_DEFAULTS if spec.device else {}
    return FAMILY_DEFAULTS[spec.family] | two_player | device | ENV_DEFAULTS.get(env_id, {})
