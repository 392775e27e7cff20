"""The command line built from the configuration's groups: `parse_flags` reads the command line once
(only the flags the user gave), `make_config` lays them over the env family's defaults and a saved
config file. Runs in the main process."""

from __future__ import annotations

import argparse
import dataclasses
import difflib

from sf_engine.config.groups import GROUPS, Config, ConfigError


def _str_to_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def value_type(fld) -> tuple:
    """(text -> value, allowed values or None) of a field, as the command line and --config read it."""
    if fld.type in ("bool", bool):
        return _str_to_bool, None
    if "choices" in fld.metadata:
        return str, fld.metadata["choices"]
    return fld.metadata.get("type", {"int": int, "float": float, "str": str}.get(fld.type, str)), None


class FlagParser(argparse.ArgumentParser):
    """An argparse parser whose flags match exactly (argparse would take --num_worker for --num_workers)
    and whose every error is a ConfigError of one line: an unknown flag names the closest one. Every
    command line of sf_engine (train.py, enjoy.py, export) is read by one."""

    def __init__(self, **kwargs):
        super().__init__(allow_abbrev=False, **kwargs)

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(self._unknown(extras[0]))
        return namespace

    def _unknown(self, arg: str) -> str:
        if not arg.startswith("-"):
            return f"unexpected argument {arg!r}: a value follows its flag (--flag VALUE); --help lists the flags"
        name = arg.partition("=")[0]
        flags = [option for option in self._option_string_actions if option.startswith("--")]
        closest = difflib.get_close_matches("--" + name.lstrip("-"), flags, n=1)
        return f"unknown flag {name}: " + (f"did you mean {closest[0]}?" if closest else "--help lists the flags")

    def error(self, message: str):
        """argparse's errors ('argument --num_workers: expected an integer ...') as one ConfigError."""
        raise ConfigError(message.removeprefix("argument "))


def build_parser() -> argparse.ArgumentParser:
    """Every field of every group as --name; a flag not given stays out of the parsed namespace (the
    env family's default or the field's own applies, see make_config). --help shows the field's
    default."""
    parser = FlagParser(
        description="Train an agent with sf_engine: asynchronous PPO on shared memory. The defaults shown are the "
        "engine's; an env family (Atari, images, continuous control) brings its own for some flags, and "
        "the flags you give always win. Every 'auto' is resolved at start and recorded in config.json.",
        argument_default=argparse.SUPPRESS,
    )
    for group_name, cls in GROUPS.items():
        group = parser.add_argument_group(group_name)
        for fld in dataclasses.fields(cls):
            convert, choices = value_type(fld)
            text = f"{fld.metadata['help']} (default: {fld.default})".replace("%", "%%")  # argparse formats help with %
            kwargs = {"help": text, "dest": f"{group_name}.{fld.name}"}
            if convert is _str_to_bool:
                kwargs.update(type=_str_to_bool, nargs="?", const=True, metavar="BOOL")
            elif choices:
                kwargs.update(choices=choices)
            else:
                kwargs.update(type=convert, metavar=fld.name.upper())
            group.add_argument(f"--{fld.name}", **kwargs)
    return parser


def parse_flags(argv=None) -> dict:
    """The flags given on the command line, {group: {field: value}}; a bad one is a ConfigError of one
    line (FlagParser). The command line is parsed here, once."""
    given: dict = {name: {} for name in GROUPS}
    for dest, value in vars(build_parser().parse_args(argv)).items():
        group_name, name = dest.split(".", 1)
        given[group_name][name] = value
    return given


def make_config(given: dict, defaults: dict | None = None, saved: dict | None = None) -> Config:
    """The fields' own defaults, overridden by `defaults` ({field name: value}, the env family's), then by
    `saved` ({group: {field: value}}, a --config file), then by the flags `given` (parse_flags)."""
    defaults, saved = defaults or {}, saved or {}
    groups = {}
    for group_name, cls in GROUPS.items():
        names = {fld.name for fld in dataclasses.fields(cls)}
        values = {name: value for name, value in defaults.items() if name in names}
        groups[group_name] = cls(**(values | saved.get(group_name, {}) | given.get(group_name, {})))
    return Config(**groups)
