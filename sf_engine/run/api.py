"""sf_engine.train: a training run from a user's Python code, the same run as train.py's (its flags are the
keyword arguments), with the user's observers, returning a RunResult. Runs in the user's process, which becomes
the run's main process; the roles run in child processes (async, sync) or in it (serial).

After each call nothing of the run is left in the process: no shared memory, child process, forkserver or
logging handler, so that a script or a notebook may train several times.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import sys
from dataclasses import dataclass

from sf_engine.config.groups import ConfigError
from sf_engine.envs import EnvError
from sf_engine.envs.registry import registered_envs
from sf_engine.model.encoders import registered_encoders
from sf_engine.run import runner
from sf_engine.runtime.checkpoint import checkpoint_dir, latest_valid_checkpoint
from sf_engine.stats.observers import check_observers
from sf_engine.stats.previous import read_summary


class RunFailed(RuntimeError):
    """The run stopped on a failure it could not go on from (a role that kept failing, a broken env): the
    message is its one line; `result` holds what the run left (its summary, its last checkpoint)."""

    def __init__(self, message: str, result: RunResult):
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class RunResult:
    """What a run left: its experiment directory, the figures of summary.json, the path of its newest
    checkpoint (None if it wrote none) and why it stopped."""

    experiment_dir: str
    summary: dict
    checkpoint: str | None
    stop_reason: str


def flags_to_argv(flags: dict) -> list:
    """train.py's command line of keyword arguments: name=value -> --name VALUE (True/False as true/false, a
    list as comma-separated values); a value of None leaves the flag at its default."""
    argv = []
    for name, value in flags.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (list, tuple)):
            value = ",".join(str(item) for item in value)
        argv += [f"--{name}", str(value)]
    return argv


def train(observers=(), **flags) -> RunResult:
    """Train as `python train.py --name value ...` does with the keyword arguments `name=value`, handing the
    run's figures, checkpoints and evaluations to `observers` (sf_engine.stats.observers). A bad flag raises
    ConfigError with train.py's one line, before anything on disk changes. Ctrl-C stops the run cleanly, then
    raises KeyboardInterrupt; a run that fails raises RunFailed; an observer that raises stops the run, and
    its exception is raised once the run has stopped."""
    observers = check_observers(observers)  # a misspelled hook is one line, before anything on disk changes
    argv = flags_to_argv(flags)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    before = _running_helpers()  # multiprocessing's helper processes the user's process ran already: they stay
    try:
        with _main_module_for_children():
            launched = runner.launch(argv, observers=observers, before_processes=_check_children_can_start)
    except EnvError as exc:
        raise ConfigError(str(exc)) from None
    finally:
        _stop_helpers_started_since(before)
        _restore_logging(root, handlers, level)
    if isinstance(launched, str):  # nothing to train: the experiment's checkpoint holds its budget
        experiment_dir = os.path.join(*_experiment(argv))
        return _result(experiment_dir, read_summary(os.path.join(experiment_dir, "summary.json")), launched)
    outcome, experiment_dir = launched
    result = _result(experiment_dir, outcome.summary, outcome.reason)
    if outcome.observer_error is not None:
        raise outcome.observer_error
    if outcome.exit_code == 130:
        raise KeyboardInterrupt
    if outcome.exit_code != 0:
        raise RunFailed(outcome.reason, result)
    return result


def _experiment(argv: list) -> tuple:
    """(train_dir, experiment) of a command line."""
    from sf_engine.config.cli import make_config, parse_flags

    cfg = make_config(parse_flags(argv))
    return cfg.run.train_dir, cfg.run.experiment


def _result(experiment_dir: str, summary: dict, reason: str) -> RunResult:
    path, _ = latest_valid_checkpoint(checkpoint_dir(experiment_dir))
    return RunResult(experiment_dir, summary, path, reason)


def _check_children_can_start(cfg) -> None:
    """Before any child process starts (async and sync modes): a ConfigError of one line where they could not
    import what they need from the user's __main__."""
    if cfg.run.mode == "serial":
        return
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is not None and os.path.isfile(path) and _called_unguarded(main, path):
        raise ConfigError(
            f"sf_engine.train() was called at the top of {os.path.basename(path)} without "
            f'`if __name__ == "__main__":`: its child processes import the script again and would start the run '
            f"again; put the call under that line (or pass mode='serial')"
        )
    if path is None or not os.path.isfile(path):
        registered = [("register_env", registered_envs()), ("register_encoder", registered_encoders())]
        for call, factories in registered:
            for name, factory in factories.items():
                if getattr(factory, "__module__", None) == "__main__":
                    raise ConfigError(
                        f"{call}({name!r}, ...): its factory is defined in an interactive session or standard "
                        f"input, which the run's child processes cannot import: define it in a module (a .py file "
                        f"you import), or pass mode='serial'"
                    )


def _called_unguarded(main, path: str) -> bool:
    """Whether this call comes from the top level of the script `path` outside `if __name__ == "__main__":`."""
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:  # called from elsewhere (an imported module, a test)
        return False
    try:
        with open(path) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return False
    line = frame.f_lineno
    return not any(
        isinstance(node, ast.If) and _is_main_test(node.test) and node.lineno <= line <= node.end_lineno
        for node in ast.walk(tree)
    )


def _is_main_test(test) -> bool:
    """`__name__ == "__main__"` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [side.id for side in sides if isinstance(side, ast.Name)]
    values = [side.value for side in sides if isinstance(side, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]


@contextlib.contextmanager
def _main_module_for_children():
    """A __main__ without a file of its own (standard input: '<stdin>') is not imported again by the child
    processes: multiprocessing would look for a file of that name and fail in every child."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or os.path.isfile(path):
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


_HELPERS = (  # multiprocessing's helper processes a run starts: (module, its instance, the pid attribute)
    (multiprocessing.forkserver, "_forkserver", "_forkserver_pid"),
    (multiprocessing.resource_tracker, "_resource_tracker", "_pid"),
)


def _running_helpers() -> list:
    """The pid of each of multiprocessing's helper processes of this process (None: not running)."""
    return [getattr(getattr(module, name, None), pid, None) for module, name, pid in _HELPERS]


def _stop_helpers_started_since(before: list) -> None:
    """The forkserver (and the resource tracker) the run started are stopped, where they did not run before: the
    next run starts its own, with the modules its env needs preloaded."""
    for (module, name, pid), was in zip(_HELPERS, before):
        helper = getattr(module, name, None)
        if was is None and getattr(helper, pid, None) is not None and hasattr(helper, "_stop"):
            helper._stop()


def _restore_logging(root, handlers: list, level: int) -> None:
    """The root logger as it was before the run: the run's console and log-file handlers closed and removed."""
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
