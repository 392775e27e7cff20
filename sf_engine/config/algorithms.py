"""Learning algorithms as the engine sees them: each one's AlgorithmSpec, the one place that says which class
learns (and so which network it publishes), what data it learns from, what it supports, its defaults, its flags,
its auto-sizing cost, what PBT may explore and its checks. Built-in specs live in their algorithm's folder
(sf_engine/algo/<name>/spec.py, found there by name: a spec module is pure data of this layer, without torch); a
user's come from sf_engine.register_algorithm(name, spec) or `--algo module:SPEC`. Runs in every process (the run
plan carries the user's registrations to the children).
"""

from __future__ import annotations

import importlib
import math
import os
import pkgutil
from dataclasses import dataclass, field
from typing import Callable

from sf_engine.config.fields import ConfigError

# what an algorithm learns from (its spec's `data`): the trajectory slots as they come, or a replay buffer whose data
# its replay transform ("module:Class", sf_engine.replay.transform) makes: the two built in, or a user's own
SLOTS = "trajectory slots"
TRANSITIONS = "sf_engine.replay.transitions:NStepTransitions"
SEQUENCES = "sf_engine.replay.sequences:Sequences"
ACTION_KINDS = ("discrete", "multi_discrete", "multi_binary", "continuous", "composite")


@dataclass(frozen=True)
class Range:
    """Where PBT draws a hyperparameter from and keeps it within (sf_engine.algo.pbt): log-uniform in [low, high], or
    with `horizon` (a discount) log-uniform in the horizon 1 / (1 - value)."""

    low: float
    high: float
    horizon: bool = False


@dataclass(frozen=True)
class AlgorithmSpec:
    """What the engine needs to know of an algorithm. `learner` names its Algorithm (sf_engine.algo.base) as
    "module:Class"; the class's `acting_network(env_spec, cfg, bf16)` builds the network it publishes, as every
    acting site builds it."""

    learner: str
    description: str  # its line in --algo's help
    data: str = SLOTS  # what it learns from: SLOTS, or its replay transform: TRANSITIONS (n-step), SEQUENCES, its own
    actions: tuple = ACTION_KINDS  # the action kinds it takes
    images: bool = True  # image observations
    embeddings: bool = True  # a Dict observation's Discrete parts as rows of a learned table (--discrete_obs embed)
    multi_agent: bool = True  # envs of several agents
    several_policies: bool = True  # --num_policies, --pbt, the opponent pool
    recurrent: str = "optional"  # a recurrent core (--rnn): "optional", "required" or "never"
    normalize_input: bool = True  # --normalize_input (its own normalizer, or the encoders')
    normalize_returns: bool = False  # --normalize_returns
    value_rescale: bool = False  # --value_rescale
    user_model: bool = False  # --model: a whole network of the user (its acting_network builds it)
    # --num_learners > 1: its class averages its gradients over the ranks (TrainingState.join_ranks: each optimizer a
    # FlatAdam, each normalizer a RunningMeanStd) and takes the same branches on every rank
    data_parallel: bool = False
    bootstrap_forwards: Callable | int = 0  # (cfg ->) forwards per trained sample besides its own (auto sizing)
    pbt: dict = field(default_factory=dict)  # name -> Range: the hyperparameters PBT explores, its fields' or common
    config: tuple = ()  # (name, dataclass): the group of its own flags, cfg.<name>, its runs' only (config.groups)
    # flag -> value, per env: {None: every env's, a family's name: its own, "device": a device env's, an env id: its
    # own}, each over the one before (the env family's own facts lie under them all: envs.families)
    defaults: dict = field(default_factory=dict)
    check: Callable | None = None  # cfg -> None: its own flags' checks, a one-line ConfigError each
    check_env: Callable | None = None  # (cfg, env_spec) -> None: its own checks of the env

    @property
    def uses_replay(self) -> bool:
        return self.data != SLOTS

    def extra_forwards(self, cfg) -> int:
        return self.bootstrap_forwards(cfg) if callable(self.bootstrap_forwards) else self.bootstrap_forwards

    def env_defaults(self, env_id: str, env_spec) -> dict:
        """Its defaults for the env `env_id` of EnvSpec `env_spec`: every env's, its family's, a device env's, the
        env's own."""
        keys = (None, env_spec.family) + (("device",) if env_spec.device else ()) + (env_id,)
        out = {}
        for key in keys:
            out |= self.defaults.get(key, {})
        return out


_BUILT_IN: dict = {}  # name -> spec, found in sf_engine/algo/<name>/spec.py
_REGISTERED: dict = {}  # name -> spec, register_algorithm() of this process
_FROM_MODULES: dict = {}  # "module:SPEC" -> spec, imported once per process


def built_in_algorithms() -> dict:
    """name -> AlgorithmSpec of every algorithm in sf_engine/algo/ (a folder holding a spec.py)."""
    if not _BUILT_IN:
        folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "algo")
        for module in pkgutil.iter_modules([folder]):
            if module.ispkg and os.path.exists(os.path.join(folder, module.name, "spec.py")):
                _BUILT_IN[module.name] = importlib.import_module(f"sf_engine.algo.{module.name}.spec").SPEC
    return _BUILT_IN


def register_algorithm(name: str, spec: AlgorithmSpec) -> None:
    """Register `spec` under `name`, usable as `--algo name` (sf_engine.register_algorithm). Call it before the
    run starts, in the script that starts it."""
    if not isinstance(spec, AlgorithmSpec):
        raise ConfigError(f"register_algorithm({name!r}, ...): the spec must be an sf_engine.AlgorithmSpec")
    if name in built_in_algorithms():
        raise ConfigError(f"register_algorithm({name!r}, ...): {name} is a built-in algorithm; choose another name")
    if ":" in name:
        raise ConfigError(f"register_algorithm({name!r}, ...): a name without ':' (MODULE:SPEC names a module's)")
    _REGISTERED[name] = spec


def registered_algorithms() -> dict:
    """name -> AlgorithmSpec of every register_algorithm() call in this process."""
    return dict(_REGISTERED)


def algorithm_registration(name: str) -> tuple:
    """The run plan's registrations for `--algo name`: ((register_algorithm, name, spec),) when it was registered
    in this process (its children register it again: sf_engine.runtime.role.register_user_code), else ()."""
    spec = _REGISTERED.get(name)
    return () if spec is None else ((register_algorithm, name, spec),)


def algorithm_names() -> tuple:
    return tuple(built_in_algorithms()) + tuple(_REGISTERED)


def algorithm_spec(name: str) -> AlgorithmSpec:
    """The spec of `--algo name`: a built-in algorithm, a registered one, or MODULE:SPEC (an AlgorithmSpec in a
    module, the current directory first); a ConfigError of one line where there is none."""
    spec = built_in_algorithms().get(name) or _REGISTERED.get(name) or _FROM_MODULES.get(name)
    if spec is not None:
        return spec
    if ":" in name:
        _FROM_MODULES[name] = _spec_of_module(name)
        return _FROM_MODULES[name]
    raise ConfigError(
        f"--algo {name}: invalid choice, no such algorithm; built in or registered: {', '.join(algorithm_names())} "
        f"(or MODULE:SPEC, an AlgorithmSpec in your module)"
    )


def _spec_of_module(text: str) -> AlgorithmSpec:
    from sf_engine.envs.user_code import import_user_module, user_attribute

    module = import_user_module(text, "--algo", ConfigError)
    spec = user_attribute(module, text, "--algo", ConfigError)
    if not isinstance(spec, AlgorithmSpec):
        raise ConfigError(f"--algo {text}: {text.partition(':')[2]!r} of {module.__name__} is not an AlgorithmSpec")
    return spec


def import_class(path: str):
    """The class of "module:Class" (a spec's learner, a role's), its module imported by name (the current directory
    first for a user's)."""
    from sf_engine.envs.user_code import import_user_module

    module = import_user_module(path, "--algo", ConfigError)
    return getattr(module, path.partition(":")[2])


# ---- the checks every spec implies (sf_engine.config.checks calls them) ----------------------------------------
_SPACE_NAMES = {
    "discrete": "a Discrete",
    "multi_discrete": "a MultiDiscrete",
    "multi_binary": "a MultiBinary",
    "continuous": "a Box",
    "composite": "a Tuple or Dict",
}
# flags that only some algorithms take, and which spec field says that one does
_OWN_FLAGS = {
    "normalize_input": ("model", lambda spec: spec.normalize_input),
    "normalize_returns": ("model", lambda spec: spec.normalize_returns),
    "value_rescale": ("q", lambda spec: spec.value_rescale),
    "model": ("model", lambda spec: spec.user_model),
}


def _those(test) -> str:
    """'--algo a, --algo b': the algorithms whose spec passes `test`."""
    return " or ".join(f"--algo {name}" for name in algorithm_names() if test(algorithm_spec(name)))


def check_algorithm_flags(cfg) -> None:
    """What the algorithm of `cfg` does not take: a one-line ConfigError naming the flag and the way out; then
    the spec's own checks."""
    name, spec = cfg.learner.algo, cfg.algorithm
    for flag, (group, takes) in _OWN_FLAGS.items():
        if getattr(getattr(cfg, group), flag) and not takes(spec):
            owners = [n for n in algorithm_names() if takes(algorithm_spec(n))]
            raise ConfigError(
                f"--{flag} is {'/'.join(n.upper() for n in owners)}'s ({_those(takes)}): drop it with --algo {name}"
            )
    rnn = cfg.model.rnn
    if spec.recurrent == "never" and rnn != "none":
        recurrent = lambda s: s.recurrent != "never"  # noqa: E731
        twins = [n for n in algorithm_names() if recurrent(algorithm_spec(n))]
        raise ConfigError(
            f"--rnn {rnn} with --algo {name}: a recurrent core is {' and '.join(n.upper() for n in twins)}'s: use "
            f"{_those(recurrent)} or --rnn none"
        )
    if spec.recurrent == "required" and rnn == "none":
        raise ConfigError(f"--algo {name} needs a recurrent core: give --rnn gru or --rnn lstm")
    p = cfg.policies
    if not spec.several_policies and (p.num_policies > 1 or p.pbt or p.pool_every_versions):
        raise ConfigError(
            f"--algo {name} trains one policy: drop --num_policies, --pbt and --pool_every_versions, or use "
            f"{_those(lambda s: s.several_policies)}"
        )
    if spec.check is not None:
        spec.check(cfg)


def check_env_for_algorithm(cfg, env_spec) -> None:
    """The env against the algorithm's spec: its action space, images, embedded observations, agents."""
    name, spec, env = cfg.learner.algo, cfg.algorithm, cfg.env.env
    kind = env_spec.action.kind
    if kind not in spec.actions:
        spaces = " or ".join(_SPACE_NAMES[k] for k in spec.actions)
        raise ConfigError(
            f"--algo {name} needs {spaces} action space; {env} has a {kind} one: use "
            f"{_those(lambda s: kind in s.actions)}"
        )
    if not spec.images and env_spec.has_image:
        raise ConfigError(
            f"--algo {name} takes vector observations; {env} has images: use {_those(lambda s: s.images)}"
        )
    if not spec.embeddings and env_spec.layout is not None and env_spec.layout.index_tables():
        raise ConfigError(
            f"--algo {name} takes vectors: --discrete_obs embed needs an encoder's embedding tables: use "
            f"--discrete_obs onehot, or {_those(lambda s: s.embeddings)}"
        )
    if not spec.multi_agent and (env_spec.num_agents > 1 or env_spec.turn_based):
        raise ConfigError(
            f"--algo {name} trains single-agent envs; {env} has {env_spec.num_agents} agents: use "
            f"{_those(lambda s: s.multi_agent)}"
        )
    if spec.check_env is not None:
        spec.check_env(cfg, env_spec)


def bounded_actions(cfg, env_spec) -> None:
    """A spec's check_env for algorithms that squash their actions into the env's bounds (SAC, TD3)."""
    if not all(map(math.isfinite, env_spec.action.low + env_spec.action.high)):
        raise ConfigError(
            f"--algo {cfg.learner.algo} squashes its actions into the env's bounds; {cfg.env.env} has unbounded Box "
            f"actions: give its action space finite low and high or use "
            f"{_those(lambda s: 'continuous' in s.actions and s.check_env is None)}"
        )
