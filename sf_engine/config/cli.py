"""The command line built from the configuration's groups: `parse_flags` reads the command line once
(only the flags the user gave), `make_config` lays them over the env family's defaults and a saved
config file. Runs in the main process."""

from __future__ import annotations

import argparse
import dataclasses
import difflib

from sf_engine.config.algorithms import algorithm_spec
from sf_engine.config.fields import current_name, type_name
from sf_engine.config.groups import (
    GROUPS,
    Config,
    ConfigError,
    LearnerConfig,
    algorithm_group_owners,
    flag_groups,
    flag_owners,
)


def _str_to_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def value_type(fld) -> tuple:
    """(text -> value, allowed values or None) of a field, as the command line and --config read it."""
    kind = type_name(fld)
    if kind == "bool":
        return _str_to_bool, None
    if "choices" in fld.metadata:
        return (lambda text: current_name(fld, text)) if "renamed" in fld.metadata else str, fld.metadata["choices"]
    return fld.metadata.get("type", {"int": int, "float": float, "str": str}.get(kind, str)), None


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


def build_parser(algo: str | None = None) -> argparse.ArgumentParser:
    """Every field of every group as --name (the groups of flag_groups(algo): every run's, every built-in
    algorithm's own, and `algo`'s own); a flag not given stays out of the parsed namespace (the env family's
    default or the field's own applies, see make_config). --help shows the field's default."""
    parser = FlagParser(
        description="Train an agent with sf_engine: asynchronous PPO on shared memory. The defaults shown are the "
        "engine's; an env family (Atari, images, continuous control) brings its own for some flags, and "
        "the flags you give always win. Every 'auto' is resolved at start and recorded in config.json.",
        argument_default=argparse.SUPPRESS,
    )
    taken: dict = {}  # flag -> its action: a flag two algorithms' groups share is the first's (the run's --algo's)
    for group_name, cls in flag_groups(algo).items():
        owners = (
            "" if group_name in GROUPS else ", ".join(f"--algo {name}" for name in algorithm_group_owners(group_name))
        )
        group = parser.add_argument_group(f"{group_name} ({owners}'s own flags)" if owners else group_name)
        for fld in dataclasses.fields(cls):
            text = f"{fld.metadata['help']} (default: {fld.default})".replace("%", "%%")  # argparse formats help with %
            if fld.name in taken:  # its help says every owner's meaning
                taken[fld.name].help += f" Also {text}"
                continue
            convert, choices = value_type(fld)
            kwargs = {"help": text, "dest": f"{group_name}.{fld.name}"}
            if convert is _str_to_bool:
                kwargs.update(type=_str_to_bool, nargs="?", const=True, metavar="BOOL")
            elif choices:
                kwargs.update(choices=choices, type=convert)
            else:
                kwargs.update(type=convert, metavar=fld.name.upper())
            taken[fld.name] = group.add_argument(f"--{fld.name}", **kwargs)
    return parser


def algo_of(argv) -> str | None:
    """The value of --algo on the command line `argv` (sys.argv when None), or None: it decides which algorithm's own
    flags the command line takes (build_parser)."""
    scan = FlagParser(add_help=False, argument_default=argparse.SUPPRESS)
    scan.add_argument("--algo")
    return getattr(scan.parse_known_args(argv)[0], "algo", None)


def parse_flags(argv=None) -> dict:
    """The flags given on the command line, {group: {field: value}}; a bad one is a ConfigError of one
    line (FlagParser). The command line is parsed here, once (its --algo first: which algorithm's flags it takes)."""
    given: dict = {}
    for dest, value in vars(build_parser(algo_of(argv)).parse_args(argv)).items():
        group_name, name = dest.split(".", 1)
        given.setdefault(group_name, {})[name] = value
    return given


def given_of_values(values: dict) -> dict:
    """The flags of Python values `values` (flag name -> value; None: not given), {group: {field: value}} as
    parse_flags gives a command line's, without a command line: a value of its field's type is taken as it is (a
    bool, an int, a float or an int for a float field, a str among the choices), any other through the flag's own
    reading of its text (a list or tuple as comma-separated items, 'auto'); an unknown flag or a bad value is the
    command line's ConfigError of one line."""
    algo = values.get("algo")
    parser = build_parser(algo if isinstance(algo, str) else None)
    fields = {}  # flag -> (group name, field): as the command line takes it (a shared flag: the run's --algo's first)
    for group_name, cls in flag_groups(algo if isinstance(algo, str) else None).items():
        for fld in dataclasses.fields(cls):
            fields.setdefault(fld.name, (group_name, fld))
    given: dict = {}
    for name, value in values.items():
        if value is None:
            continue
        if name not in fields:
            parser.error(parser._unknown(f"--{name}"))
        group_name, fld = fields[name]
        given.setdefault(group_name, {})[name] = _value_of(parser, name, fld, value)
    return given


def command_line_of(given: dict) -> list:
    """train.py's command line of flags `given` ({group: {field: value}}), as config.json records it: --name VALUE
    (true/false, a list comma-separated)."""
    line = []
    for values in given.values():
        for name, value in values.items():
            if isinstance(value, bool):
                value = str(value).lower()
            elif isinstance(value, (list, tuple)):
                value = ",".join(str(item) for item in value)
            line += [f"--{name}", str(value)]
    return line


def _value_of(parser: FlagParser, name: str, fld, value):
    """`value` for the field `fld` of flag `name` (given_of_values)."""
    convert, choices = value_type(fld)
    kind = type_name(fld)
    if isinstance(value, bool):
        if kind == "bool":
            return value
        value = "true" if value else "false"
    elif kind == "int" and isinstance(value, int) or kind == "float" and isinstance(value, (int, float)):
        return float(value) if kind == "float" else value
    elif isinstance(value, (list, tuple)):
        value = ",".join(str(item) for item in value)
    text = value if isinstance(value, str) else str(value)
    if choices:
        text = convert(text)
        if text not in choices:
            parser.error(f"--{name}: invalid choice: {text!r} (choose from {', '.join(map(repr, choices))})")
        return text
    try:
        return convert(text)
    except argparse.ArgumentTypeError as exc:
        parser.error(f"--{name}: {exc}")
    except (TypeError, ValueError):
        parser.error(f"--{name}: invalid {getattr(convert, '__name__', 'value')} value: {text!r}")


def make_config(given: dict, defaults: dict | None = None, saved: dict | None = None) -> Config:
    """The fields' own defaults, overridden by `defaults` ({field name: value}, the env family's and the
    algorithm's), then by `saved` ({group: {field: value}}, a --config file), then by the flags `given`
    (parse_flags). The groups are every run's and the algorithm's own (of `given`'s --algo, else `saved`'s): a
    flag given of another algorithm's group is a ConfigError of one line; a saved file's is left out (the config of
    a run of another algorithm)."""
    defaults, saved = defaults or {}, saved or {}
    algo = given.get("learner", {}).get("algo") or saved.get("learner", {}).get("algo") or LearnerConfig.algo
    own = algorithm_spec(algo).config
    groups = GROUPS | dict([own] if own else [])
    for group_name, values in given.items():
        if group_name not in groups and values:
            flag = next(iter(values))
            owners = " or ".join(f"--algo {name}" for name in flag_owners(flag))
            raise ConfigError(f"--{flag} is {owners}'s flag: drop it with --algo {algo}, or use {owners}")
    made = {}
    for group_name, cls in groups.items():
        names = {fld.name for fld in dataclasses.fields(cls)}
        values = {name: value for name, value in defaults.items() if name in names}
        made[group_name] = cls(**(values | saved.get(group_name, {}) | given.get(group_name, {})))
    return Config(**{name: made[name] for name in GROUPS}, algo_group=made[own[0]] if own else None)
