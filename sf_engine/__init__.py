"""sf_engine: a single-node, high-throughput, shared-memory reinforcement-learning engine.

The public API (docs/api.md):
- `train(config=None, **flags)`: a training run, every train.py flag a keyword argument (`algo`, `encoder`, `model`
  and `env` also take the object itself), over a `Config` where one is given (a RunResult's `config`),
  `observers=[...]`; a RunResult;
- `load_policy(path)`: a trained agent (a Policy) whose `act(obs)` gives the env's actions;
- `register_env(name, make_env)`: your own env as `env=name`; `register_encoder(name, factory)`: your own network
  from observations to features as `encoder=name`;
- `register_algorithm(name, AlgorithmSpec(...))`: your own learning algorithm as `algo=name`;
- `ConfigError` (a bad flag, one line), `RunFailed` (a run that failed), `LoadError` (load_policy's one line).

What a plug-in author needs:
- `Observer`: the base of an observer, its hooks `on_report`, `on_checkpoint`, `on_evaluation`, `on_bottleneck`;
- `ActingNetwork`: the acting contract its network keeps, `act(obs, state, ActContext) -> ActOutput`; `Encoder`, the
  engine's observations -> features (the built-in encoders or the user's --encoder, the input normalizers), the
  first stage of every network; `flatten_state` (a model's whole state as the one flat vector the learner
  publishes) and `FlatAdam` (Adam over it);
- `TrainingState` and `Holds`: an algorithm's training state named once, its state, load and copy_from derived;
- `Algorithm`: the protocol of a learning algorithm, built as `cls(cfg, spec, device, hooks)` with `TrainingHooks`,
  its `train(batch)` returning a `TrainResult`; `schedule_learning_rate` (--lr_schedule, in force);
- the batches it trains on: `TrajectoryBatch` (whole trajectory slots), `ReplayBatch` (replay transitions),
  `SequenceBatch` (replay sequences);
- `AlgorithmSpec` and its `data` values `SLOTS`, `TRANSITIONS`, `SEQUENCES`; `flag_field(default, help)`, a field
  of the algorithm's own group of flags (its spec's `config`), and `Range(low, high)`, a hyperparameter's for PBT.

Everything but the registries, the spec, Config and ConfigError is imported when first used (no torch, no TensorBoard on
`import sf_engine`): every process of a run imports this package.
"""

from sf_engine.config.algorithms import SEQUENCES, SLOTS, TRANSITIONS, AlgorithmSpec, Range, register_algorithm
from sf_engine.config.fields import flag_field
from sf_engine.config.groups import Config, ConfigError
from sf_engine.envs.registry import register_env
from sf_engine.model.encoders import register_encoder

__version__ = "0.1.0"

_LAZY = {
    "train": "sf_engine.run.api",
    "RunResult": "sf_engine.run.api",
    "RunFailed": "sf_engine.run.api",
    "load_policy": "sf_engine.play.policy",
    "Policy": "sf_engine.play.policy",
    "LoadError": "sf_engine.play.loading",
    "Observer": "sf_engine.stats.observers",
    "Algorithm": "sf_engine.algo.base",
    "TrainResult": "sf_engine.algo.base",
    "TrainingHooks": "sf_engine.algo.base",
    "schedule_learning_rate": "sf_engine.algo.base",
    "TrajectoryBatch": "sf_engine.algo.batch",
    "ReplayBatch": "sf_engine.algo.batch",
    "SequenceBatch": "sf_engine.algo.batch",
    "ActContext": "sf_engine.model.acting",
    "ActOutput": "sf_engine.model.acting",
    "ActingNetwork": "sf_engine.model.acting",
    "Encoder": "sf_engine.model.features",
    "flatten_state": "sf_engine.model.flat_state",
    "FlatAdam": "sf_engine.model.flat_state",
    "TrainingState": "sf_engine.algo.training_state",
    "Holds": "sf_engine.algo.training_state",
}


def __getattr__(name: str):
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sf_engine' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ActContext",
    "ActOutput",
    "ActingNetwork",
    "Algorithm",
    "AlgorithmSpec",
    "Config",
    "ConfigError",
    "Encoder",
    "FlatAdam",
    "Holds",
    "LoadError",
    "Observer",
    "Policy",
    "Range",
    "ReplayBatch",
    "RunFailed",
    "RunResult",
    "SEQUENCES",
    "SLOTS",
    "SequenceBatch",
    "TRANSITIONS",
    "TrainResult",
    "TrainingHooks",
    "TrainingState",
    "TrajectoryBatch",
    "flag_field",
    "flatten_state",
    "load_policy",
    "register_algorithm",
    "register_encoder",
    "register_env",
    "schedule_learning_rate",
    "train",
]
