"""The non-finite guard of the processes that step envs (rollout workers, device samplers): a step holding a
non-finite observation, reward or continuous action is not trained on (`valid` False, marked `non_finite`: the
learner books it apart), its values are set to 0 so that nothing non-finite reaches a network, and each env that
gave one is named in the log once.
"""

from __future__ import annotations

import logging
import math

import numpy as np

# what an env did, for the log: a non-finite action (from the policy), reward or observation
NON_FINITE = (
    "got a non-finite action from the policy",
    "returned a non-finite reward",
    "returned a non-finite observation",
)


def zero_non_finite(arrays) -> np.ndarray | None:
    """The rows (first axis) of the float `arrays` that hold a non-finite value, as one bool [E], those
    values set to 0 in place; None when every value is finite. The common case costs one vectorised pass
    per array: x . x is finite unless a value is not (or the sum overflows: the exact check finds none)."""
    rows = None
    for array in arrays:
        if math.isfinite(np.vdot(array, array)):  # half the time of np.isfinite(array).all()
            continue
        finite = np.isfinite(array)
        if finite.all():
            continue
        array[~finite] = 0
        bad = ~finite.reshape(len(array), -1).all(1)
        rows = bad if rows is None else rows | bad
    return rows


class NonFiniteGuard:
    """What a rollout worker or a device sampler checks for non-finite values in the slots it writes: its envs'
    float observations (uint8 frames cannot hold one) and rewards, and the policy's continuous actions before they
    reach an env. A step holding one is not trained on (`valid` False, marked `non_finite`: the learner books it
    apart), its values are set to 0 so that nothing non-finite reaches a network, and each env that gave one is
    named in the log once."""

    def __init__(self, buffers, env_id: str, worker: int, num_splits: int, envs_per_split: int):
        self.buffers = buffers
        self.obs_keys = tuple(key for key, array in buffers.obs.items() if array.dtype.kind == "f")
        self.actions = buffers.actions.dtype.kind == "f"  # continuous actions
        self.env_id, self.worker, self.envs_per_split = env_id, worker, envs_per_split
        self.steps = [0] * num_splits  # env steps each split has taken
        self.named = np.zeros((num_splits, envs_per_split), bool)

    def name(self, split: int, rows: np.ndarray, what: str) -> None:
        """Name in the log each env of `rows` [E] (of `split`) not named yet: `what` it did."""
        for row in np.flatnonzero(rows & ~self.named[split]):
            logging.warning(
                "env %s (worker %d, env %d) %s at step %d: its samples are skipped (each such env is named once)",
                self.env_id,
                self.worker,
                split * self.envs_per_split + row,
                what,
                self.steps[split],
            )
        self.named[split] |= rows

    def skip(self, split: int, slot: int, row: int, bad: tuple, next_valid: np.ndarray) -> tuple:
        """Not trained on: step `row` where its action, its reward or the obs after it was not finite (its
        value target would bootstrap from that obs), and the next step where that obs was. `bad`: the rows
        of each (or None); their values are 0 by now (zero_non_finite), and a zeroed action's log-prob is
        set to 0 too. Only steps that were trainable are marked `non_finite` (a reset step stays one).
        Returns (the next step's valid, its rows skipped for their obs or None)."""
        buf, (actions, _, obs) = self.buffers, bad
        step = np.logical_or.reduce([rows for rows in bad if rows is not None])
        buf.non_finite[slot, row] |= step & buf.valid[slot, row]
        buf.valid[slot, row] &= ~step
        if actions is not None:
            buf.log_probs[slot, row][actions] = 0.0
        skipped = None
        if obs is not None:
            skipped, next_valid = next_valid & obs, next_valid & ~obs
        for rows, what in zip(bad, NON_FINITE):
            if rows is not None:
                self.name(split, rows, what)
        return next_valid, skipped
