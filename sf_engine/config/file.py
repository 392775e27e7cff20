"""--config FILE: the settings of a saved config.json (of an earlier run, say), each read as its flag
would be and checked; runs in the main process while the run plan is built (sf_engine.run.plan)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from sf_engine.config.cli import value_type
from sf_engine.config.fields import type_name
from sf_engine.config.groups import ConfigError, flag_groups

# a saved config never names another file, restarts an experiment, or says where this run writes
_NOT_FROM_FILE = ("config", "restart", "experiment", "train_dir", "shm_dir")


def _json_type_fits(fld, value) -> bool:
    """Whether a config.json value has the JSON type of its field (a number for a number, true/false for
    a switch, a string for a name or choice; 'auto' where the field takes it)."""
    kind = type_name(fld)
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind.startswith("int"):
        return isinstance(value, int) or (value == "auto" and "str" in kind)
    if "float" in kind:
        return isinstance(value, (int, float))
    return isinstance(value, str)


def read_config_file(path: str, algo: str | None = None) -> dict:
    """{group: {field: value}} of a saved config.json (--config), each value read as its flag would be: the groups
    of every run, of every built-in algorithm and of `algo`'s (--algo given), else of the file's own --algo;
    ConfigError (one line) for a file that is not such a config."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"--config {path}: cannot be read ({exc.__class__.__name__}); pass the config.json of an experiment"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: not a config.json (no settings in it)")
    values: dict = {}
    learner = data.get("learner")
    saved_algo = learner.get("algo") if isinstance(learner, dict) else None
    for group_name, cls in flag_groups(algo or (saved_algo if isinstance(saved_algo, str) else None)).items():
        section, fields = data.get(group_name, {}), {fld.name: fld for fld in dataclasses.fields(cls)}
        if not isinstance(section, dict):
            raise ConfigError(f"--config {path}: '{group_name}' is not a group of settings")
        for name, value in section.items():
            if name not in fields:
                raise ConfigError(
                    f"--config {path}: unknown setting {group_name}.{name}: was it written by this version of train.py?"
                )
            if name in _NOT_FROM_FILE or (value is None and fields[name].default is None):
                continue
            convert, choices = value_type(fields[name])
            try:
                converted = convert(str(value)) if _json_type_fits(fields[name], value) else None
            except (ValueError, TypeError, argparse.ArgumentTypeError):
                converted = None
            if converted is None or (choices and converted not in choices):
                raise ConfigError(f"--config {path}: {group_name}.{name} = {value!r} is not a valid --{name}")
            values.setdefault(group_name, {})[name] = converted
    return values
