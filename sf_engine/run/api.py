"""sf_engine.train: a training run from a user's Python code, the same run as train.py's (its flags are the
keyword arguments), with the user's observers, returning a RunResult. Runs in the user's process, which becomes
the run's main process; the roles run in child processes (async, sync) or in it (serial).

After each call nothing of the run is left in the process: no shared memory, child process, forkserver or
logging handler, so that a script or a notebook may train several times.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import logging
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import sys
from dataclasses import dataclass

from sf_engine.config.algorithms import AlgorithmSpec, built_in_algorithms, register_algorithm, registered_algorithms
from sf_engine.config.cli import given_of_values, make_config
from sf_engine.config.groups import Config, ConfigError
from sf_engine.envs import EnvError
from sf_engine.envs.registry import register_env, registered_envs
from sf_engine.model.encoders import register_encoder, registered_encoders
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

    @property
    def config(self) -> Config:
        """The run's whole configuration as it ran (its config.json, every 'auto' resolved): train(result.config,
        experiment="again") trains with the same settings."""
        with open(os.path.join(self.experiment_dir, "config.json")) as f:
            return Config.from_dict(json.load(f))


def train(config: Config | None = None, *, observers=(), **flags) -> RunResult:
    """Train as `python train.py --name value ...` does with the keyword arguments `name=value` (Python values:
    True, 3e-4, [64, 64]; sf_engine.config.cli.given_of_values), over `config` where one is given (a Config: its
    values that differ from the fields' defaults, as if given; the keywords win), handing the run's figures,
    checkpoints and evaluations to `observers` (sf_engine.stats.observers). A few flags also take the object
    itself (`objects_as_flags`): `algo` an AlgorithmSpec, `encoder` a factory, `model` a network class, `env` a
    factory. A bad flag raises ConfigError with train.py's one line, before anything on disk changes. Ctrl-C stops
    the run cleanly, then raises KeyboardInterrupt; a run that fails raises RunFailed; an observer that raises
    stops the run, and its exception is raised once the run has stopped."""
    observers = check_observers(observers)  # a misspelled hook is one line, before anything on disk changes
    given = _given(config, flags)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    before = _running_helpers()  # multiprocessing's helper processes the user's process ran already: they stay
    try:
        with _main_module_for_children():
            launched = runner.launch(given, observers=observers, before_processes=_check_children_can_start)
    except EnvError as exc:
        raise ConfigError(str(exc)) from None
    finally:
        _stop_helpers_started_since(before)
        _restore_logging(root, handlers, level)
    if isinstance(launched, str):  # nothing to train: the experiment's checkpoint holds its budget
        experiment_dir = os.path.join(*_experiment(given))
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


def _given(config: Config | None, flags: dict) -> dict:
    """The flags of a call: `config`'s values that differ from their fields' defaults, then the keywords' (their
    objects registered: objects_as_flags), {group: {field: value}}."""
    if config is not None and not isinstance(config, Config):
        raise ConfigError(
            f"train(config=...): a {type(config).__name__} is no sf_engine.Config; pass flags as keywords instead"
        )
    values = _changed(config) if config is not None else {}
    return given_of_values(values | objects_as_flags(flags))


def _changed(config: Config) -> dict:
    """flag -> value of every field of `config`'s groups that differs from the field's default."""
    values = {}
    for group in config.groups().values():
        for fld in dataclasses.fields(group):
            value = getattr(group, fld.name)
            if value != fld.default:
                values[fld.name] = value
    return values


def objects_as_flags(flags: dict) -> dict:
    """`flags` with the objects some flags take in place of a name: `algo` an AlgorithmSpec (the name it is known by,
    else registered under its learner's "module.Class"), `encoder` a factory and `env` a
    factory (registered under their function's name), `model` a class ("module:Class"). A name that another
    object holds already is a ConfigError of one line."""
    out = dict(flags)
    spec = flags.get("algo")
    if isinstance(spec, AlgorithmSpec):
        known = built_in_algorithms() | registered_algorithms()
        out["algo"] = _registered_name(spec, known, spec.learner.replace(":", "."), "algo")
        if out["algo"] not in known:
            register_algorithm(out["algo"], spec)
    for flag, registry, register in (
        ("encoder", registered_encoders, register_encoder),
        ("env", registered_envs, register_env),
    ):
        factory = flags.get(flag)
        if callable(factory):
            out[flag] = _registered_name(factory, registry(), getattr(factory, "__name__", ""), flag)
            register(out[flag], factory)
    model = flags.get("model")
    if isinstance(model, type):
        out["model"] = f"{model.__module__}:{model.__qualname__}"
    return out


def _registered_name(thing, registry: dict, name: str, flag: str) -> str:
    """The name `thing` is registered under in `registry`, else `name` where it is free."""
    for taken, held in registry.items():
        if held is thing:
            return taken
    held = registry.get(name)
    if held is not None and _same_definition(held, thing):  # defined again (a notebook's cell run again)
        return name
    if not name or held is not None:
        register = {"algo": "register_algorithm", "encoder": "register_encoder", "env": "register_env"}[flag]
        raise ConfigError(
            f"{flag}={thing!r:.60}: its name {name!r} is taken or empty: register it under a name of its own "
            f"(sf_engine.{register}(name, ...)) and pass {flag}=name"
        )
    return name


def _same_definition(held, thing) -> bool:
    """Whether two functions or classes are one definition made twice (the same module and qualified name)."""
    names = [(getattr(x, "__module__", None), getattr(x, "__qualname__", None)) for x in (held, thing)]
    return names[0] == names[1] and names[0][1] is not None


def _experiment(given: dict) -> tuple:
    """(train_dir, experiment) of a call's flags."""
    cfg = make_config(given)
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
