"""Replayed sequences (sf_engine.SEQUENCES: R2D2's), a replay transform (sf_engine.replay.transform): where they
start in the replay buffer's columns, which of them may be trained on, and cutting a sampled batch of them out of
the buffer's arrays. Runs in the learner process (the layout in the main process); NumPy over the buffer's arrays.

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

from sf_engine.config.fields import ConfigError
from sf_engine.replay.transform import SlotSteps
from sf_engine.replay.transitions import NStepTransitions


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


class Sequences:
    """Its arrays: each step's n-step targets (NStepTransitions': returns, steps, discounts, trainable [C, T]),
    rnn_states [C, T+1, H] float32 (the recurrent state each row was acted from, as the slot holds it) and
    episode_start [C, T+1] bool (the state is zeroed before that row). A sample is the sequence at one of a column's
    starts; its priority sits at that start's leaf. The rate limiter counts a sequence as its L steps."""

    def __init__(self, gamma: float, shape: SequenceShape):
        self.shape, self.steps_per_sample = shape, shape.length
        self.transitions = NStepTransitions(gamma, shape.n_step)

    @classmethod
    def from_config(cls, cfg) -> Sequences:
        r = cfg.replay
        return cls(cfg.learner.gamma, SequenceShape(r.burn_in, r.replay_sequence_length, r.n_step))

    @staticmethod
    def check(cfg) -> None:
        """A trajectory slot's column holds a burn-in and at least one sequence."""
        r, rollout = cfg.replay, cfg.sampler.rollout
        if rollout < r.burn_in + r.replay_sequence_length:
            raise ConfigError(
                f"--rollout ({rollout}) must be at least --burn_in + --replay_sequence_length "
                f"({r.burn_in} + {r.replay_sequence_length}) with --algo {cfg.learner.algo}: raise --rollout or "
                f"lower the others"
            )

    def arrays(self, columns: int, rollout: int, state: int) -> dict:
        return self.transitions.arrays(columns, rollout, state) | {
            "rnn_states": ((columns, rollout + 1, state), "float32"),
            "episode_start": ((columns, rollout + 1), "bool"),
        }

    def rows(self, rollout: int) -> np.ndarray:
        return self.shape.starts(rollout)

    def insert(self, arrays: dict, columns: np.ndarray, steps: SlotSteps) -> np.ndarray:
        """The steps' targets, the slot's states and episode starts; the starts of the sequences that hold a
        trainable step may be drawn."""
        trainable = self.transitions.insert(arrays, columns, steps)
        arrays["rnn_states"][columns] = steps.rnn_states.swapaxes(0, 1)
        arrays["episode_start"][columns] = steps.episode_start.T
        starts = self.rows(trainable.shape[1])
        leaves = np.zeros_like(trainable)
        leaves[:, starts] = sequences_trainable(trainable, starts, self.shape.length)
        return leaves

    def samplable(self, arrays: dict, indices: np.ndarray) -> np.ndarray:
        rows = indices[:, None] + np.arange(self.shape.length)  # within the column: start + L <= T
        return arrays["trainable"].reshape(-1)[rows].any(axis=1)

    def cut(self, arrays: dict, obs: dict, indices: np.ndarray, weights: np.ndarray) -> SequenceSample:
        return cut_sequences(arrays, obs, indices, weights, self.shape)

    def batch(self, sample: SequenceSample, tensor, discrete: bool):
        from sf_engine.algo.batch import SequenceBatch

        return SequenceBatch(
            obs={key: tensor(value) for key, value in sample.obs.items()},
            episode_start=tensor(sample.episode_start),
            initial_state=tensor(sample.initial_state),
            actions=tensor(sample.actions.astype(np.int64, copy=False)).reshape(sample.returns.shape),
            returns=tensor(sample.returns),
            steps=tensor(sample.steps),
            discounts=tensor(sample.discounts),
            trainable=tensor(sample.trainable),
            weights=tensor(sample.weights),
            burn_in=self.shape.burn_in,
        )
