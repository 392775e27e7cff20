"""What every group of the configuration builds its flags from: a field with its --help text, the type of a flag
that takes an integer or 'auto', and ConfigError (a bad flag's one line)."""

from __future__ import annotations

import argparse
from dataclasses import field


class ConfigError(ValueError):
    """A bad flag or combination: the message is one line naming the flag and the fix."""


def flag_field(default, help_text: str, **kw):
    """A config field: its default, the --help text, and (kw) choices or a type for the command line; `renamed`:
    {former name: name} of the choices that had another name, still read from command lines and saved configs."""
    return field(default=default, metadata={"help": help_text, **kw})


def current_name(fld, value):
    """`value` of the field `fld` by its name now (a choice's former name, `renamed` in its metadata, is read as the
    name it has now)."""
    return fld.metadata.get("renamed", {}).get(value, value) if isinstance(value, str) else value


def type_name(fld) -> str:
    """A field's type as written ('float', 'int | str'), whether its module's annotations are strings (from
    __future__ import annotations) or the types themselves (a user's group may have either)."""
    return fld.type if isinstance(fld.type, str) else getattr(fld.type, "__name__", str(fld.type))


def int_or_auto(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None
