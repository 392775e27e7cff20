"""A user's own code named on the command line as MODULE:NAME (`--env my_training:GoRight`, `--encoder
my_encoder:make`, `enjoy.py --opponent my_players:greedy`). The module is imported as `python -m` imports:
the current directory first on sys.path, so that a my_training.py in the directory the command runs from is
found. Every
process that needs the module imports it through here, the rollout workers too (a worker's sys.path is
the forkserver's, fixed when it started, so a change made by the main process would not reach it).
A module that is not found, or that fails while importing, is one line: where it was looked for, or the
exception and the file:line that raised it. Runs in the main process (probing), rollout workers,
learner, policy worker (a user's encoder), evaluator, the replaying process.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import os
import sys
import traceback


@contextlib.contextmanager
def _current_directory_first():
    """The current directory first on sys.path while importing; afterwards last (where it was not on it
    already), so that what the module imports later (inside a function) is found too, while nothing
    installed is shadowed by a file of the directory for the rest of the process."""
    cwd = os.getcwd()
    sys.path.insert(0, cwd)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # the module may have changed sys.path itself
            sys.path.remove(cwd)
        if not any(os.path.abspath(entry or os.curdir) == cwd for entry in sys.path):
            sys.path.append(cwd)


def _shown(path: str) -> str:
    """A path as the user would write it: relative to the current directory when under it."""
    relative = os.path.relpath(path)
    return path if relative.startswith(os.pardir) else relative


def describe_exception(exc: BaseException, libraries: tuple = ()) -> str:
    """'ValueError: bad size (my_training.py:12)': the exception, the first line of its message and the
    file:line that raised it (the innermost frame of its traceback; a SyntaxError's own line). `libraries`:
    directories whose code is not the user's (torch's): the innermost frame outside them, where there is one."""
    message = ((exc.msg if isinstance(exc, SyntaxError) else str(exc)).splitlines() or [""])[0]
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f"{_shown(exc.filename)}:{exc.lineno}"
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
        if libraries:
            frames = [f for f in frames if not f.filename.startswith(libraries)] or frames
        where = f"{_shown(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    text = f"{exc.__class__.__name__}: {message}" if message else exc.__class__.__name__
    return f"{text} ({where})" if where else text


def _not_found(module_name: str, missing: str) -> str:
    """Where `missing` (the module itself, or a package on its way) was looked for, and the ways to fix it."""
    parent, _, leaf = missing.rpartition(".")
    if parent and getattr(sys.modules.get(parent), "__path__", None):
        folder = _shown(list(sys.modules[parent].__path__)[0])
        return f"package {parent} ({folder}) has no module {leaf} ({os.path.join(folder, leaf)}.py not found)"
    file = "./" + module_name.replace(".", "/") + ".py"
    pythonpath = os.environ.get("PYTHONPATH")
    return (
        f"{file} not found in {os.getcwd()} (the current directory), nor on PYTHONPATH "
        f"({pythonpath if pythonpath else 'not set'}), nor installed: run the command from the directory that "
        f"holds it, add its directory to PYTHONPATH, or pip install the package that provides module "
        f"{missing.split('.')[0]!r} (its name may differ)"
    )


def import_user_module(text: str, flag: str, error: type):
    """The module of `text` (MODULE:NAME, the value of `flag`), imported with the current directory first
    on sys.path; `error` (an exception class) with one line when it cannot be."""
    module_name = text.partition(":")[0]
    try:
        with _current_directory_first():
            return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        parts = module_name.split(".")
        if exc.name in {".".join(parts[: i + 1]) for i in range(len(parts))}:  # the module itself
            raise error(
                f"{flag} {text}: cannot import module {module_name!r}: {_not_found(module_name, exc.name)}"
            ) from None
        raise error(
            f"{flag} {text}: importing {module_name} failed: {describe_exception(exc)}: pip install the package "
            f"that provides module {(exc.name or '').split('.')[0]!r} (its name may differ)"
        ) from None
    except Exception as exc:  # the user's module raised while importing: its own error, where it was raised
        raise error(f"{flag} {text}: importing {module_name} failed: {describe_exception(exc)}") from None


def user_attribute(module, text: str, flag: str, error: type):
    """The attribute NAME of `module` that `text` (MODULE:NAME) names, or `error` naming the closest one."""
    name = text.partition(":")[2]
    if hasattr(module, name):
        return getattr(module, name)
    where = _shown(module.__file__) if getattr(module, "__file__", None) else module.__name__
    closest = difflib.get_close_matches(name, [n for n in dir(module) if not n.startswith("_")], n=1)
    hint = f": did you mean {module.__name__}:{closest[0]}?" if closest else ""
    raise error(f"{flag} {text}: cannot import it: {module.__name__} ({where}) has no {name!r}{hint}")
