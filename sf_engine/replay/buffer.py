"""The replay buffer: full trajectory slots copied in as raw steps, samples drawn out uniformly or in proportion to
priority. Runs in the learner process (or the runner in serial mode) over the arrays that sf_engine.replay.layout
lays out in the run's shared memory (its observations, in device mode on a GPU, in the GPU's memory:
sf_engine.runtime.device_slots), so a learner restarted after a crash finds what its predecessor inserted.

A slot of E envs becomes E columns of the ring, each an env's T steps (sf_engine.replay.transform.RAW_ARRAYS) and
T + 1 observation rows (the slot's bootstrap row included). What a sample is, what else a column keeps to make one
and which rows may be drawn is the algorithm's replay transform's (its spec's `data`: n-step transitions,
sf_engine.replay.transitions; sequences, sf_engine.replay.sequences); the buffer draws the flat indices
(column x T + row) and keeps their priorities. Shapes: B = samples drawn.
"""

from __future__ import annotations

import os
import zipfile

import numpy as np

from sf_engine.replay.layout import REPLAY_FILLED, REPLAY_NEXT
from sf_engine.replay.sum_tree import SumTree, importance_weights
from sf_engine.replay.transform import RAW_ARRAYS, ReplayTransform, SlotSteps

PRIORITY_EPS = 1e-6  # added to |TD error| so that no transition's priority falls to 0


class ReplayBuffer:
    def __init__(self, arrays: dict, transform: ReplayTransform, prioritized: bool, per_alpha: float, seed: int):
        """`arrays`: name -> the shared array (SharedBuffers.replay); `transform`: the algorithm's."""
        self.arrays, self.transform = arrays, transform
        self.obs = {name.removeprefix("obs."): array for name, array in arrays.items() if name.startswith("obs.")}
        self.counters = arrays["counters"]
        self.columns, self.rollout = arrays["valid"].shape
        self.capacity = self.columns * self.rollout
        self.per_alpha = per_alpha
        self.tree = SumTree(self.capacity, arrays["priorities"]) if prioritized else None
        self.rng = np.random.default_rng(seed)
        self.rows = transform.rows(self.rollout)  # [K] the rows of a column where a sample may start

    @property
    def size(self) -> int:
        """Transitions stored (trainable or not)."""
        return int(self.counters[REPLAY_FILLED]) * self.rollout

    def insert(self, slot: SlotSteps) -> int:
        """Copy one slot in (its fields time-major: [T+1, E, ...] and [T, E, ...]). Returns the env steps it held
        (T x E). The E columns written next are overwritten (the oldest data)."""
        steps, envs = slot.rewards.shape
        columns = (int(self.counters[REPLAY_NEXT]) + np.arange(envs)) % self.columns
        for key, rows in slot.obs.items():
            _put_columns(self.obs[key], columns, rows)
        for name in RAW_ARRAYS:
            self.arrays[name][columns] = getattr(slot, name).swapaxes(0, 1)
        samplable = self.transform.insert(self.arrays, columns, slot)  # [E, T]
        if self.tree is not None:  # new samples at the running maximum priority, the rest at 0
            leaves = (columns[:, None] * self.rollout + np.arange(self.rollout)).reshape(-1)
            highest = self.tree.max_priority() or 1.0
            self.tree.update(leaves, np.where(samplable.reshape(-1), highest, 0.0))
        self.counters[REPLAY_NEXT] = (columns[-1] + 1) % self.columns
        self.counters[REPLAY_FILLED] = min(self.columns, int(self.counters[REPLAY_FILLED]) + envs)
        return steps * envs

    def sample(self, batch: int, beta: float):
        """`batch` samples, cut by the transform: in proportion to priority with --prioritized (and importance
        weights ** `beta`), else uniformly among those that may be drawn."""
        if self.tree is not None:
            indices = self.tree.sample(batch, self.rng)
            weights = importance_weights(self.tree.priorities(indices), beta)
        else:
            indices, weights = self._uniform(batch), np.ones(batch)
        return self.transform.cut(self.arrays, self.obs, indices, weights)

    def _uniform(self, batch: int) -> np.ndarray:
        """`batch` flat indices drawn uniformly among the samples stored that may be drawn (rejection: the others are
        a few per cent)."""

        def draw(count: int) -> np.ndarray:
            columns = self.rng.integers(0, int(self.counters[REPLAY_FILLED]), count)
            return columns * self.rollout + self.rows[self.rng.integers(0, len(self.rows), count)]

        indices = draw(batch)
        for _ in range(1000):
            bad = ~self.transform.samplable(self.arrays, indices)
            if not bad.any():
                return indices
            indices[bad] = draw(int(bad.sum()))
        raise RuntimeError("the replay buffer holds (almost) no trainable transition")

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        """Priorities (|TD error| + eps) ** --per_alpha of the transitions sampled at `indices` (no-op
        without --prioritized). A transition replaced since it was sampled by an untrainable one keeps priority
        0; one replaced by a trainable one would take the old TD error (the learner updates before it inserts
        again, so none is)."""
        if self.tree is None:
            return
        priorities = (np.abs(td_errors) + PRIORITY_EPS) ** self.per_alpha
        self.tree.update(indices, priorities, only_positive=True)  # one replaced by an untrainable one stays at 0

    # --- saved beside a checkpoint (--save_replay) ---------------------------------------------------------
    def save(self, path: str) -> None:
        """Every array of the buffer into `path` (.npz, uncompressed), atomically: a temporary file, fsync,
        rename. Raises OSError (a full disk, say); the previous file then stays."""
        temporary = f"{path}.{os.getpid()}.tmp"  # a killed writer's is removed as a checkpoint's (*.tmp)
        try:
            with open(temporary, "wb") as f:
                np.savez(f, **{name: _on_host(array) for name, array in self.arrays.items()})
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)

    def load(self, path: str) -> str:
        """Refill from a file save() wrote (NumPy arrays only: no pickled object is read). Returns one line
        on what was loaded, or why nothing was (another layout: a changed --replay_size, say; the buffer is
        then untouched). A file that is no .npz archive raises ValueError; a torn or corrupt array,
        zipfile.BadZipFile (its CRC) or ValueError, and the buffer is then untouched or empty, never half
        loaded."""
        if not zipfile.is_zipfile(path):  # np.load would take it for a pickle, and say how to unpickle it
            raise ValueError(f"{path} is not a saved replay buffer (not an .npz archive)")
        with np.load(path, allow_pickle=False) as saved:
            mismatched = [
                name
                for name, array in self.arrays.items()
                if _stored(saved, name) != (tuple(array.shape), _on_host(array[:0]).dtype)  # [:0]: the dtype only
            ]
            if mismatched:
                return f"replay buffer {path} not loaded: its {mismatched[0]} does not fit this run's buffer"
            try:
                for name, array in self.arrays.items():  # each array read once; a torn one fails its CRC here
                    _fill(array, saved[name])
            except Exception:
                self._clear()  # empty rather than half loaded (counters that promise data the file did not hold)
                raise
        if self.tree is not None:
            self.tree.rebuild()
        return f"replay buffer refilled from {path}: {self.size:,} transitions"

    def _clear(self) -> None:
        """Empty the buffer: nothing stored, inserted or sampled, every priority 0."""
        self.counters[...] = 0
        if self.tree is not None:
            self.arrays["priorities"][...] = 0.0
            self.tree.rebuild()


# The buffer's observations are NumPy arrays in the run's shared memory, or in device mode on a GPU tensors in its
# memory (sf_engine.runtime.device_slots): written, read, saved and loaded through these.
def _put_columns(array, columns: np.ndarray, rows) -> None:
    """array[columns] = rows [T + 1, E, ...] swapped to [E, T + 1, ...]."""
    if isinstance(array, np.ndarray):
        array[columns] = rows.swapaxes(0, 1)
        return
    import torch

    array[torch.as_tensor(columns, device=array.device)] = torch.as_tensor(rows, device=array.device).transpose(0, 1)


def _on_host(array) -> np.ndarray:
    return array if isinstance(array, np.ndarray) else array.cpu().numpy()


def _fill(array, saved: np.ndarray) -> None:
    if isinstance(array, np.ndarray):
        array[...] = saved
        return
    import torch

    array.copy_(torch.from_numpy(saved))


def _stored(saved, name: str):
    """(shape, dtype) of array `name` in a file save() wrote, read from its header alone (the data stays on
    disk); None when the file lacks it."""
    if name not in saved.files:
        return None
    with saved.zip.open(f"{name}.npy") as member:
        major, _ = np.lib.format.read_magic(member)
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(member)
    return shape, dtype
