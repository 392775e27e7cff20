"""The env families hold env facts only (envs.families: each a registered EnvFamily with its probe test, its fewest
envs per worker and the flags the env implies); each algorithm's settings for a family are its spec's. Both name
flags: make_config takes from the defaults only the names that are fields of a config group, so a misspelt name
would be dropped without a word, and the engine's own default would train in its place."""

import dataclasses

import pytest

from sf_engine.config.algorithms import built_in_algorithms
from sf_engine.config.groups import GROUPS, flag_groups
from sf_engine.envs import EnvFamily, FamilyEvidence, family, flag_defaults, register_family, registered_families
from sf_engine.envs import families as families_module
from sf_engine.envs.families import _FAMILIES
from sf_engine.envs.spec import ActionSpec, EnvSpec

FLAGS = {fld.name for cls in flag_groups().values() for fld in dataclasses.fields(cls)}  # every algorithm's too
# the flags of the env itself, which a family may imply; everything else is an algorithm's choice
ENV_FACTS = {"encoder", "eval_every_sec", "eval_episodes", "worker_num_splits", "rollout", "num_envs_per_worker"}


@pytest.mark.parametrize("name", [f.name for f in registered_families()])
def test_a_family_implies_env_facts_only(name):
    assert set(family(name).defaults) <= ENV_FACTS & FLAGS, family(name).defaults


@pytest.mark.parametrize("algo", sorted(built_in_algorithms()))
def test_every_algorithms_defaults_name_its_flags_and_a_family_or_an_env(algo):
    spec = built_in_algorithms()[algo]
    flags = {fld.name for cls in [*GROUPS.values(), *spec.config[1:]] for fld in dataclasses.fields(cls)}
    names = {f.name for f in registered_families()}
    for key, defaults in spec.defaults.items():
        assert key is None or key in names or key == "device" or "-v" in key, (algo, key)
        unknown = sorted(set(defaults) - flags)
        assert not unknown, f"{algo}'s defaults for {key!r} name no flag of its: {unknown}"


def _evidence(env_id="MyEnv-v0", kind="discrete", obs=(("obs", (4,), "float32"),), **flags):
    action = (
        ActionSpec(kind, nvec=(2,)) if kind == "discrete" else ActionSpec(kind, shape=(1,), low=(-1.0,), high=(1.0,))
    )
    return FamilyEvidence(env_id, EnvSpec(obs=obs, action=action, **flags))


@pytest.mark.parametrize(
    "evidence, name",
    [
        (_evidence(), "classic"),
        (_evidence(kind="continuous"), "continuous"),
        (_evidence("LunarLander-v3"), "box2d"),
        (_evidence("CarRacing-v3", obs=(("obs", (96, 96, 3), "uint8"),)), "image"),
        (_evidence(turn_based=True, agents=("a", "b")), "turns"),
        (_evidence("doom_basic", obs=(("obs", (3, 72, 128), "uint8"),)), "doom"),
        (FamilyEvidence("Pong-v5", _evidence(obs=(("obs", (4, 84, 84), "uint8"),)).spec, atari=True), "atari"),
    ],
)
def test_the_first_family_whose_test_passes_is_the_envs(evidence, name):
    from sf_engine.envs.families import family_of

    assert family_of(evidence) == name


def test_a_new_family_is_one_registration_and_an_algorithms_defaults_for_it_apply(monkeypatch):
    from sf_engine.config.algorithms import algorithm_spec
    from sf_engine.envs.families import family_of

    monkeypatch.setattr(families_module, "_FAMILIES", list(_FAMILIES))
    register_family(EnvFamily("grid", "grid worlds", lambda e: e.env_id.startswith("Grid"), 64, {"encoder": "mlp"}))
    with pytest.raises(ValueError, match="exists already"):
        register_family(EnvFamily("grid", "again", lambda e: True, 1))
    spec = _evidence("GridWorld-v0").spec
    assert family_of(_evidence("GridWorld-v0")) == "grid" and family_of(_evidence()) == "classic"
    grid = dataclasses.replace(spec, family="grid")
    assert flag_defaults(grid) == {"encoder": "mlp"} and family("grid").envs_per_worker == 64
    ppo = dataclasses.replace(algorithm_spec("ppo"), defaults={"grid": {"learning_rate": 1e-3}})
    assert ppo.env_defaults("GridWorld-v0", grid) == {"learning_rate": 1e-3}


def test_an_algorithms_defaults_go_every_env_family_device_then_the_env():
    from sf_engine.config.algorithms import AlgorithmSpec

    spec = AlgorithmSpec(
        learner="m:C",
        description="",
        defaults={None: {"a": 0, "b": 0}, "classic": {"a": 1, "c": 1}, "device": {"c": 2}, "Env-v0": {"d": 3}},
    )
    device = dataclasses.replace(_evidence().spec, device=True)
    assert spec.env_defaults("Env-v0", device) == {"a": 1, "b": 0, "c": 2, "d": 3}
    assert spec.env_defaults("Other-v0", _evidence().spec) == {"a": 1, "b": 0, "c": 1}
