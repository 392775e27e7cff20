"""Proportional prioritized sampling (Schaul et al. 2016, "Prioritized Experience Replay") as a sum tree in one
float64 array, so that the array can be a view of the replay buffer's shared memory and a restarted learner
finds the priorities it left. Runs in the learner process.

Each node sums FANOUT children, up to a top level of at most TOP_NODES nodes. `update` and `sample` walk the
tree one level at a time over the whole batch, a few NumPy calls per level, so their cost is the number of
levels: `sample` searches the top level in one go (its running sum and a binary search), then descends 2
levels at a million leaves and 3 at 2**21, where a binary tree walks 20 and 21. Where the compiled CPU kernels
are built (sf_engine/csrc/sum_tree.cpp), `sample` and `update` are one call each with the same arithmetic (the
same leaves for the same draws): at the classic-control DQN's batch of 128 the NumPy calls cost a fifth of a
learner step (perf/replay_cost.py).

The array, `tree_size(capacity)` floats:
    [0]                 the running max of every priority ever set (what a new transition gets)
    [1 : 1 + top]       the top level (the leaves themselves under TOP_NODES leaves); the total is its sum
    then each level below it down to the leaves, each rounded up to a multiple of FANOUT floats; the
    padding stays 0. Node j of a level sums floats [j * FANOUT, (j + 1) * FANOUT) of the level below it.
"""

from __future__ import annotations

import numpy as np

FANOUT = 16  # children per node
TOP_NODES = 4096  # the most nodes of the top level, which `sample` searches whole
_ONES = np.ones(FANOUT)  # a node's sum as a matrix-vector product: faster than a reduction over rows this short


def _compiled_ops():
    """The compiled kernels' ops (sf_engine/csrc/sum_tree.cpp among them), or None where they are not built.
    Imported here, not at the top: the main process imports this module (tree_size) and needs no torch."""
    from sf_engine.model.kernels import KERNELS

    return KERNELS


def _level_sizes(capacity: int) -> list[int]:
    """Floats of each level of a tree over `capacity` leaves: the leaves first, the top last."""
    if capacity < 1:
        raise ValueError(f"a sum tree needs at least one leaf, got capacity {capacity}")
    sizes, nodes = [], capacity
    while nodes > TOP_NODES:
        parents = -(-nodes // FANOUT)
        sizes.append(parents * FANOUT)
        nodes = parents
    return sizes + [nodes]


def tree_size(capacity: int) -> int:
    """Floats of the array a SumTree over `capacity` leaves needs (so the caller can allocate it in shared memory)."""
    return 1 + sum(_level_sizes(capacity))


def importance_weights(priorities: np.ndarray, beta: float) -> np.ndarray:
    """Schaul et al.'s importance-sampling weights of a sampled batch: (N * P(i)) ** -beta with P(i) = priority /
    total over the N transitions stored, divided by their max over the batch so that the largest is 1. Divided
    by that max, N and the total cancel: (priority / the batch's least priority) ** -beta, two NumPy calls fewer.
    `priorities`: [B] the sampled leaves' priorities (`SumTree.priorities`), all > 0. Returns float64 [B]."""
    priorities = np.asarray(priorities, np.float64)
    return (priorities / priorities.min()) ** -beta


class SumTree:
    """Proportional prioritized sampling (Schaul et al. 2016) over `capacity` leaves. `storage`: a float64
    array of tree_size(capacity) zeros (a shared-memory view) or None (allocated here). Leaf priority 0 is
    never sampled. `compiled`: run `sample` and `update` in the compiled kernels (the default where they are
    built) or in NumPy.

    A tree given an array that holds a tree already (a restarted learner's) sees that tree's state; it
    recomputes every sum from the leaves first, since the learner that wrote it may have died between a
    leaf and its sums. One process uses a tree at a time: nothing here is locked."""

    def __init__(self, capacity: int, storage: np.ndarray | None = None, compiled: bool | None = None):
        sizes = _level_sizes(capacity)
        size = 1 + sum(sizes)
        if storage is None:
            storage = np.zeros(size)
        elif storage.dtype != np.float64 or storage.shape != (size,):
            raise ValueError(
                f"a sum tree over {capacity} leaves needs float64 [{size}], got {storage.dtype} {storage.shape}"
            )
        self.capacity = capacity
        self._storage = storage
        levels, offsets, offset = [], [], 1
        for floats in reversed(sizes):  # the top first, as they lie in the array
            levels.append(storage[offset : offset + floats])
            offsets.append(offset)
            offset += floats
        self._levels = levels[::-1]  # the leaves first, the top last
        self._offsets, self._sizes = offsets[::-1], sizes  # each level's first float and floats, as the kernels take
        self._leaves, self._top = self._levels[0], self._levels[-1]
        # [nodes of the level above, FANOUT]: row j holds the children of node j
        self._children = [level.reshape(-1, FANOUT) for level in self._levels[:-1]]
        self._kernels = None if compiled is False else _compiled_ops()
        if compiled and self._kernels is None:
            raise ValueError("compiled=True needs the compiled CPU kernels (built by `make install`)")
        self.compiled = self._kernels is not None  # the way `sample` and `update` run
        if self._kernels is not None:
            import torch

            self._from_numpy = torch.from_numpy
            self._tensor = torch.from_numpy(storage)  # the same memory, as the kernels take it
        self.rebuild()

    def rebuild(self) -> None:
        """Recompute every sum from the leaves (a few milliseconds at a million leaves)."""
        for children, parents in zip(self._children, self._levels[1:]):
            np.matmul(children, _ONES, out=parents[: len(children)])

    def update(self, indices: np.ndarray, priorities: np.ndarray, only_positive: bool = False) -> None:
        """Set the leaves `indices` (int64 [B], may repeat: the last value of a repeated index wins) to
        `priorities` (float [B], >= 0, finite) and fix every sum above them. With `only_positive`, a leaf at
        priority 0 before the call keeps it (a transition replaced by one never to be sampled since it was drawn)."""
        indices = np.ascontiguousarray(indices, np.int64)
        priorities = np.ascontiguousarray(priorities, np.float64)
        if indices.ndim != 1 or indices.shape != priorities.shape:
            raise ValueError(
                f"update needs indices and priorities of one shape [B], got {indices.shape} and {priorities.shape}"
            )
        if indices.size == 0:
            return
        if self._kernels is not None:
            fault = self._kernels.sum_tree_update(
                self._tensor, self._offsets, self._sizes, self.capacity, self._from_numpy(indices),
                self._from_numpy(priorities), only_positive,
            )  # fmt: skip
            if fault:
                self._check(indices, priorities)
            return
        self._check(indices, priorities)
        if only_positive:
            keep = self._leaves[indices] > 0
            indices, priorities = indices[keep], priorities[keep]
            if indices.size == 0:
                return
        # NumPy leaves the winner of a repeated index in one assignment unspecified: keep each index's last
        order = np.argsort(indices, kind="stable")
        ordered = indices[order]
        last = np.empty(len(ordered), bool)
        last[-1] = True
        np.not_equal(ordered[1:], ordered[:-1], out=last[:-1])
        nodes = ordered[last]
        self._leaves[nodes] = priorities[order[last]]
        self._storage[0] = max(self._storage[0], priorities.max())
        for children, parents in zip(self._children, self._levels[1:]):
            nodes //= FANOUT
            parents[nodes] = children[nodes] @ _ONES

    def _check(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Raises ValueError for a leaf index outside the tree or a priority < 0 or not finite."""
        if indices.min() < 0 or indices.max() >= self.capacity:
            raise ValueError(f"leaf indices must lie in [0, {self.capacity}), got {indices.min()}..{indices.max()}")
        if not (priorities.min() >= 0 and priorities.max() < np.inf):  # NaN fails both
            raise ValueError("priorities must be finite and >= 0")

    def total(self) -> float:
        """The sum of every leaf's priority (the top level's sum)."""
        return float(self._top.sum())

    def max_priority(self) -> float:
        """The running max of every priority ever set, never lowered when that leaf is (Schaul et al. give a
        new transition this priority); 0 before the first update. Kept in the array, so it outlives a learner."""
        return float(self._storage[0])

    def priorities(self, indices: np.ndarray) -> np.ndarray:
        """The priorities of the leaves `indices` (int64 [B]): float64 [B], a copy."""
        return self._leaves[np.asarray(indices, np.int64)]

    def sample(self, batch: int, rng: np.random.Generator) -> np.ndarray:
        """[batch] int64 leaf indices drawn proportional to priority, stratified (one uniform draw in each of
        `batch` equal segments of the total, as Schaul et al.). Never an index with priority 0: where float
        rounding puts a draw past a node's last child, it takes the node's last child with priority > 0.

        Each level finds, for every draw, the first node whose running sum (left to right) exceeds the draw's
        target; that node has priority > 0 (the running sum moved there), and the target less the sum before
        that node is the target among its children."""
        if batch >= 1 and self._kernels is not None:
            uniforms = self._from_numpy(np.asarray(rng.random(batch), np.float64))
            leaves = self._kernels.sum_tree_sample(self._tensor, self._offsets, self._sizes, uniforms)
            if len(leaves):
                return leaves.numpy()
        top = self._top
        before = np.zeros(len(top) + 1)  # before[n]: the sum of the top nodes left of node n
        np.cumsum(top, out=before[1:])
        if batch < 1 or not before[-1] > 0:
            raise ValueError(f"sample needs batch >= 1 and a priority > 0 in the tree, got {batch} and {before[-1]}")
        targets = (np.arange(batch) + rng.random(batch)) * (before[-1] / batch)  # the mass left to walk past
        nodes = np.searchsorted(before[1:], targets, side="right")
        past = nodes == len(top)
        if np.count_nonzero(past):
            nodes[past] = np.flatnonzero(top)[-1]
        targets -= before[nodes]
        return self._descend(nodes, targets)

    def _descend(self, nodes: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """From `nodes` (int64 [B]) of the top level down to the leaves, each draw walking past `targets`
        (float64 [B], >= 0) of its node's children's mass; both are updated in place. Returns leaf indices."""
        rows = np.arange(len(nodes))
        before = np.zeros((len(nodes), FANOUT + 1))  # before[:, c]: the mass of the children left of child c
        column = targets[:, None]
        for children in reversed(self._children):
            block = children[nodes]
            np.add.accumulate(block, axis=1, out=before[:, 1:])
            passed = before[:, 1:] <= column  # [B, FANOUT]: True for the first few children, then False
            child = passed.argmin(axis=1)  # the first child not passed; 0 where rounding passed them all
            past = passed[:, -1]
            if np.count_nonzero(past):
                child[past] = FANOUT - 1 - np.argmax(block[past, ::-1] > 0, axis=1)
            targets -= before[rows, child]
            nodes *= FANOUT
            nodes += child
        return nodes
