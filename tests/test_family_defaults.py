"""The env families' flag defaults (envs.families.flag_defaults: a family's, then an env's own) name flags.
The run plan lays them under the user's flags with make_config, which takes from them only the names that
are fields of a config group: a misspelt name would be dropped without a word, and the engine's own default
would train in its place."""

import dataclasses

import pytest

from sf_engine.config.groups import flag_groups
from sf_engine.envs.families import ENVS_PER_WORKER_HINT, FAMILY_DEFAULTS
from sf_engine.envs.partially_observed import ENV_DEFAULTS

FLAGS = {fld.name for cls in flag_groups().values() for fld in dataclasses.fields(cls)}  # every algorithm's too


@pytest.mark.parametrize("family", sorted(FAMILY_DEFAULTS))
def test_every_family_default_names_a_flag(family):
    unknown = sorted(set(FAMILY_DEFAULTS[family]) - FLAGS)
    assert not unknown, f"FAMILY_DEFAULTS[{family!r}] names no flag: {unknown}"


@pytest.mark.parametrize("env_id", sorted(ENV_DEFAULTS))
def test_every_env_default_names_a_flag(env_id):
    unknown = sorted(set(ENV_DEFAULTS[env_id]) - FLAGS)
    assert not unknown, f"ENV_DEFAULTS[{env_id!r}] names no flag: {unknown}"


def test_every_family_has_defaults_and_an_envs_per_worker_hint():
    assert set(ENVS_PER_WORKER_HINT) == set(FAMILY_DEFAULTS)
