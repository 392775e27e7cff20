"""What an algorithm that learns from replay supplies to the replay buffer: its transform, the class its spec's `data`
names ("module:Class"; sf_engine.TRANSITIONS and sf_engine.SEQUENCES name the two built in,
sf_engine.replay.transitions and sf_engine.replay.sequences). The buffer (sf_engine.replay.buffer) keeps the raw
steps of every slot inserted, one column per env (RAW_ARRAYS), chooses which samples to draw (uniformly or by
priority) and keeps their priorities; the transform says what else a column keeps (n-step returns, recurrent
states, ...), computes it as a slot goes in, says which of a column's rows a sample may start at, and cuts the drawn
samples into the batch its algorithm's `train` takes. A new kind of replayed data is a new transform, no edit here.

The main process builds the transform to lay the buffer out (`arrays`) and to check the run's flags (`check`), so a
transform's module imports no torch at its top (its `batch` imports it). Shapes: C columns, T = rollout, E envs of
a slot, B = samples drawn; a sample's flat index is column x T + row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from sf_engine.config.algorithms import import_class
from sf_engine.config.fields import ConfigError

# the raw steps the buffer keeps of every slot, name -> (the shape after [C, T] (None: the action's), dtype); the
# observations (obs.<key>, [C, T+1, *shape]) beside them
RAW_ARRAYS = {
    "actions": (None, None),
    "rewards": ((), "float32"),
    "terminated": ((), "bool"),
    "truncated": ((), "bool"),
    "valid": ((), "bool"),
    "policy_version": ((), "int64"),
}
TRANSFORM_METHODS = ("from_config", "check", "arrays", "rows", "insert", "samplable", "cut", "batch")


@dataclass
class SlotSteps:
    """One trajectory slot as it goes into the buffer (NumPy, or the observations as tensors on a GPU in device mode):
    obs key -> [T+1, E, *shape]; actions [T, E, ...]; rewards float32, terminated, truncated, valid bool and
    policy_version int64, each [T, E]; with a recurrent policy rnn_states [T+1, E, H] float32 (the state each row
    was acted from) and episode_start [T+1, E] bool, else None."""

    obs: dict
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    valid: np.ndarray
    policy_version: np.ndarray
    rnn_states: np.ndarray | None = None
    episode_start: np.ndarray | None = None


class ReplayTransform(Protocol):
    """An algorithm's replayed data (see the module's docstring). `arrays` below is the buffer's: name -> its
    array (RAW_ARRAYS, the transform's own, "obs.<key>"), `obs` key -> the observations' [C, T+1, *shape]."""

    steps_per_sample: int  # env steps one sample trains on: the rate limiter counts them against --replay_ratio

    @classmethod
    def from_config(cls, cfg) -> ReplayTransform:
        """Built from the run's resolved Config (its flags: --n_step, ...)."""

    @staticmethod
    def check(cfg) -> None:
        """The run's flags against what the transform needs: a one-line ConfigError naming the flag."""

    def arrays(self, columns: int, rollout: int, state: int) -> dict:
        """name -> (shape, dtype) of what it keeps besides the raw steps (`state`: floats of recurrent state)."""

    def rows(self, rollout: int) -> np.ndarray:
        """int64 [K]: the rows of a column where a sample may start (every row, or a sequence's starts)."""

    def insert(self, arrays: dict, columns: np.ndarray, steps: SlotSteps) -> np.ndarray:
        """Write its arrays at `columns` [E] from the slot's raw steps; returns bool [E, T]: the rows that may be
        drawn (a priority of 0 elsewhere)."""

    def samplable(self, arrays: dict, indices: np.ndarray) -> np.ndarray:
        """bool [B]: whether each flat index (at one of its `rows`) may be drawn, for uniform sampling."""

    def cut(self, arrays: dict, obs: dict, indices: np.ndarray, weights: np.ndarray):
        """The samples at flat `indices` [B] with importance `weights` [B] (NumPy copies); the result has
        `indices` and `policy_version` (the version that acted each step trained on)."""

    def batch(self, sample, tensor: Callable, discrete: bool):
        """The sample as its algorithm's batch: every array through `tensor` (to the learner's device);
        `discrete`: the env's actions are one Discrete (int64 indices), else their own dtype."""


def replay_transform(cfg) -> ReplayTransform:
    """The transform the run's algorithm's spec names, built from `cfg`."""
    return transform_class(cfg).from_config(cfg)


def transform_class(cfg):
    """The class the spec's `data` names; a ConfigError of one line where it is no transform."""
    data = cfg.algorithm.data
    cls = import_class(data)
    missing = [name for name in TRANSFORM_METHODS if not callable(getattr(cls, name, None))]
    if missing:
        raise ConfigError(
            f"--algo {cfg.learner.algo}: its spec's data {data!r} is no replay transform: it lacks "
            f"{', '.join(missing)} (sf_engine.replay.transform.ReplayTransform)"
        )
    return cls
