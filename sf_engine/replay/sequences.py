"""R2D2's replayed sequences (--algo r2d2): where they start in the replay buffer's columns, which of them may be
trained on, and cutting a sampled batch of them out of the buffer's arrays. Runs in the learner process; pure
NumPy over the arrays of sf_engine.replay.layout.

A column holds one env's T steps of one trajectory slot (T = rollout) and its T + 1 rows of observations, recurrent
states (the state each row was acted from) and episode starts. Its sequences of L = --replay_sequence_length steps
start at rows from burn_in to T - L, at most L/2 apart (overlapping by half or more; burn_in, burn_in + L/2, ...
when L/2 divides T - L - burn_in, else spread evenly), so that every row from burn_in to T - 1 lies in a sequence
and the --burn_in rows before each start are in the column: rows before burn_in serve only as burn-in (a fraction
burn_in / T of the env steps is never a training step). A sampled sequence is the window of rows [start - burn_in,
start + L + n_step) (rows past T repeat row T: they are never read), its initial state the stored state of row
start - burn_in; its training steps are rows [start, start + L), whose n-step targets read rows up to T (an n-step
window is shortened at the slot's end).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class SequenceShape(NamedTuple):
    """The geometry of the replayed sequences: --burn_in, --replay_sequence_length, --n_step."""

    burn_in: int
    length: int
    n_step: int

    @property
    def window(self) -> int:
        """Rows a sampled sequence carries: its burn-in, its steps, and the n-step targets' next rows."""
        return self.burn_in + self.length + self.n_step

    def starts(self, rollout: int) -> np.ndarray:
        """int64 [K]: the rows where a column's sequences start (K >= 1 when rollout >= burn_in + length): from
        burn_in to rollout - length, the fewest starts at most L/2 apart, spread evenly (every L/2 rows when L/2
        divides the span), so that every row from burn_in on lies in a sequence."""
        span, hop = rollout - self.length - self.burn_in, max(self.length // 2, 1)
        count = -(-span // hop) + 1
        return self.burn_in + np.arange(count, dtype=np.int64) * span // max(count - 1, 1)


def sequences_trainable(trainable: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """bool [C, K]: whether the sequence at each start of each column holds a trainable step (`trainable` [C, T],
    the columns' n-step transitions that may be trained on)."""
    steps = starts[:, None] + np.arange(length)  # [K, L]
    return trainable[:, steps].any(axis=2)


@dataclass
class SequenceSample:
    """A sampled batch of B sequences (NumPy, copies), time-major. W = window rows, L = steps trained:
    obs key -> [W, B, *shape] (stored dtype), episode_start [W, B] bool, initial_state [B, H] float32 (the
    state window row 0 was acted from); for the L steps from the sequence's start (window row burn_in):
    actions [L, B, ...], returns [L, B] float32, steps [L, B] int64 (n: the next observation is n rows on),
    discounts [L, B] float32, trainable [L, B] bool, policy_version [L, B] int64; weights [B] float32 (importance
    weights; 1 without priorities), indices [B] int64 (the flat index of each sequence's start, for priorities)."""

    obs: dict
    episode_start: np.ndarray
    initial_state: np.ndarray
    actions: np.ndarray
    returns: np.ndarray
    steps: np.ndarray
    discounts: np.ndarray
    trainable: np.ndarray
    policy_version: np.ndarray
    weights: np.ndarray
    indices: np.ndarray


def cut_sequences(arrays: dict, obs: dict, indices: np.ndarray, weights: np.ndarray, shape: SequenceShape):
    """The sequences starting at flat indices `indices` [B] (column x T + start) out of the buffer's `arrays`
    (name -> array, as ReplayBuffer holds them; `obs`: key -> replay.obs.<key>) -> SequenceSample."""
    rollout = arrays["returns"].shape[1]
    columns, starts = np.divmod(indices, rollout)
    first = starts - shape.burn_in
    rows = np.minimum(first[:, None] + np.arange(shape.window), rollout)  # [B, W]
    steps = starts[:, None] + np.arange(shape.length)  # [B, L]

    def time_major(array, at):  # array[column, at[b, i]] -> [i, b, ...]
        return np.ascontiguousarray(array[columns[:, None], at].swapaxes(0, 1))

    return SequenceSample(
        obs={key: time_major(array, rows) for key, array in obs.items()},
        episode_start=time_major(arrays["episode_start"], rows),
        initial_state=arrays["rnn_states"][columns, first],
        actions=time_major(arrays["actions"], steps),
        returns=time_major(arrays["returns"], steps),
        steps=time_major(arrays["steps"], steps).astype(np.int64),
        discounts=time_major(arrays["discounts"], steps),
        trainable=time_major(arrays["trainable"], steps),
        policy_version=time_major(arrays["policy_version"], steps),
        weights=weights.astype(np.float32),
        indices=indices,
    )
