"""The env families: each a registered EnvFamily, the test that says an env is of it (the probe, envs.probe, tries
them in order), the fewest envs per rollout worker that --num_envs_per_worker auto picks and the flags the env itself
implies. The runner reads them while it builds the run plan (sf_engine.config.cli.make_config puts them, then the
algorithm's own defaults for the family, under the user's flags, which always win).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .doom_scenarios import is_doom
from .spec import EnvSpec

# Box2D's games (Gymnasium's box2d envs; EnvPool steps the same ids in C++): the box2d family where they observe
# vectors (CarRacing's 96x96 colour frames take the image family's)
BOX2D_GAMES = ("LunarLander", "LunarLanderContinuous", "BipedalWalker", "BipedalWalkerHardcore", "CarRacing")


def game_name(env_id: str) -> str:
    """An env id's name without its module, namespace or version (`gymnasium:ALE/Breakout-v5`: `Breakout`)."""
    return env_id.split(":")[-1].split("/")[-1].rsplit("-v", 1)[0]


def is_box2d(env_id: str) -> bool:
    """Whether `env_id` is one of Box2D's games, of any version (`LunarLander-v3`, `gymnasium:BipedalWalker-v3`)."""
    return game_name(env_id) in BOX2D_GAMES


@dataclass(frozen=True)
class FamilyEvidence:
    """What the probe knows of an env when it picks its family: its id, its EnvSpec (without a family yet) and
    whether it is an Atari game (EnvPool's, or Gymnasium's ALE with ale_py installed)."""

    env_id: str
    spec: EnvSpec
    atari: bool = False


@dataclass(frozen=True)
class EnvFamily:
    """A kind of env, as facts of the env only: the test that says an env is of it, the fewest envs per rollout
    worker that --num_envs_per_worker auto picks (fewer make too few, too correlated samples), and the flags the env
    itself implies (the encoder its observations need). What each algorithm trains such envs with is its own: its
    spec's defaults for the family (sf_engine.config.algorithms.AlgorithmSpec.defaults)."""

    name: str
    description: str
    test: Callable[[FamilyEvidence], bool]
    envs_per_worker: int
    defaults: dict = field(default_factory=dict)  # flag -> value


_FAMILIES: list = []  # in the order the probe tries them: the first whose test passes is the env's


def register_family(family: EnvFamily, before: str | None = None) -> None:
    """`family` tried by the probe before the family named `before` (before "classic", the last, where None):
    a new family is this one call (its flag defaults, per algorithm, in the algorithms' specs)."""
    names = [f.name for f in _FAMILIES]
    if family.name in names:
        raise ValueError(f"register_family: a family {family.name!r} exists already")
    position = names.index(before or "classic") if _FAMILIES else 0
    _FAMILIES.insert(position, family)


def registered_families() -> tuple:
    """Every family, in the order the probe tries them."""
    return tuple(_FAMILIES)


def family(name: str) -> EnvFamily:
    return next(f for f in _FAMILIES if f.name == name)


def family_of(evidence: FamilyEvidence) -> str:
    """The name of the first family whose test the env passes (classic's passes any)."""
    return next(f.name for f in _FAMILIES if f.test(evidence))


def _vectors(evidence: FamilyEvidence) -> bool:
    return not evidence.spec.has_image


register_family(EnvFamily("classic", "vector observations, discrete actions", lambda e: True, 128))
register_family(
    EnvFamily(
        "continuous",
        "vector observations, Box actions",
        lambda e: _vectors(e) and e.spec.action.kind == "continuous",
        32,
    )
)
register_family(
    EnvFamily("box2d", "Box2D's games on vectors", lambda e: _vectors(e) and is_box2d(e.env_id), 32),
    before="continuous",
)
register_family(EnvFamily("image", "image observations", lambda e: e.spec.has_image, 16), before="box2d")
register_family(
    EnvFamily("turns", "turn-based games of several agents (PettingZoo AEC)", lambda e: e.spec.turn_based, 128),
    before="image",
)
register_family(
    EnvFamily("doom", "VizDoom's scenarios", lambda e: is_doom(e.env_id), 32, {"encoder": "convnet_simple"}),
    before="turns",
)
register_family(
    EnvFamily("atari", "Atari games", lambda e: e.atari, 32, {"encoder": "nature_cnn"}),
    before="doom",
)


# two-player turn-based games: the mean return of a zero-sum game stays 0 in self-play, so the evaluator plays 20
# games against a random player every 30 s (the win rate is what moves; about 0.15 s of one core each time on
# Connect Four; --eval_every_sec 0 turns it off)
TWO_PLAYER_DEFAULTS = {"eval_every_sec": 30.0, "eval_episodes": 20}


# a device env (envs.device): its sampler steps the whole batch at once, one slot per rollout (no double buffering),
# its rollout sized by device mode (sf_engine.run.autosize: short, so that an on-policy batch is many envs wide, as a
# step of the batch costs about the same for more envs)
DEVICE_DEFAULTS = {"worker_num_splits": 1, "rollout": "auto"}


def flag_defaults(spec: EnvSpec) -> dict:
    """{flag name: value}: what the env implies whatever learns on it: its family's facts, then a two-player game's
    evaluations, then a device env's sampling. Each algorithm's own defaults for the env (its spec's for the family
    and the env) go over them."""
    two_player = TWO_PLAYER_DEFAULTS if spec.family == "turns" and len(spec.agents) == 2 else {}
    device = DEVICE_DEFAULTS if spec.device else {}
    return family(spec.family).defaults | two_player | device
