"""sf_engine: a single-node, high-throughput, shared-memory reinforcement-learning engine.

The public API (docs/api.md):
- `train(**flags)`: a training run, every train.py flag a keyword argument, `observers=[...]`; a RunResult;
- `load_policy(path)`: a trained agent whose `act(obs)` gives the env's actions;
- `register_env(name, make_env)`: your own env as `env=name`; `register_encoder(name, factory)`: your own network
  from observations to features as `encoder=name`;
- `register_algorithm(name, AlgorithmSpec(...))`: your own learning algorithm as `algo=name`;
- `ConfigError` (a bad flag, one line), `RunFailed` (a run that failed), `LoadError` (load_policy's one line).

The training and playing parts are imported when first used: every process of a run imports this package.
"""

from sf_engine.config.algorithms import AlgorithmSpec, register_algorithm
from sf_engine.config.groups import ConfigError
from sf_engine.envs.registry import register_env
from sf_engine.model.encoders import register_encoder

__version__ = "0.1.0"

_LAZY = {
    "train": "sf_engine.run.api",
    "RunResult": "sf_engine.run.api",
    "RunFailed": "sf_engine.run.api",
    "load_policy": "sf_engine.play.policy",
    "Policy": "sf_engine.play.policy",
}


def __getattr__(name: str):
    import importlib

    if name == "LoadError":
        from sf_engine.play.loading import EnjoyError

        return EnjoyError
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sf_engine' has no attribute {name!r}")


__all__ = [
    "AlgorithmSpec",
    "ConfigError",
    "LoadError",
    "Policy",
    "RunFailed",
    "RunResult",
    "load_policy",
    "register_algorithm",
    "register_encoder",
    "register_env",
    "train",
]
