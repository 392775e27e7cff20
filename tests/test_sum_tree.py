"""The prioritized-replay sum tree (sf_engine/replay/sum_tree.py) against brute-force proportional sampling over
the same priorities: the distribution of its stratified draws, importance weights, zero priorities never drawn,
repeated indices, the total, and a second tree over the same (shared) array. Every test runs on both ways of
sampling and updating, the compiled kernels' (sf_engine/csrc/sum_tree.cpp) and NumPy's, and the two draw the
same leaves from the same array and the same draws."""

import numpy as np
import pytest

from sf_engine.replay import sum_tree
from sf_engine.replay.sum_tree import FANOUT, TOP_NODES, SumTree, importance_weights, tree_size

# the top level alone; one level below it; two levels below it. None a power of two.
CAPACITIES = [13, 5_000, 100_003]


@pytest.fixture(autouse=True, params=["compiled", "numpy"])
def way(request, monkeypatch):
    """The trees of each test sample and update in the compiled kernels (the default where they are built, as
    `make install` builds them), or in NumPy."""
    if request.param == "numpy":
        monkeypatch.setattr(sum_tree, "_compiled_ops", lambda: None)
    else:
        assert sum_tree._compiled_ops() is not None, "the compiled CPU kernels are not built (make install)"
    return request.param


def _random_priorities(capacity: int, rng: np.random.Generator) -> np.ndarray:
    """[capacity] priorities: at most 2,000 leaves > 0 (scattered, the last leaf among them), the rest 0."""
    priorities = np.zeros(capacity)
    chosen = rng.choice(capacity, size=min(capacity, 2_000), replace=False)
    priorities[chosen] = rng.uniform(0.1, 2.0, len(chosen))
    priorities[capacity - 1] = 3.0
    return priorities


def _tree_over(priorities: np.ndarray) -> SumTree:
    tree = SumTree(len(priorities))
    tree.update(np.arange(len(priorities)), priorities)
    return tree


class _LastDraw:
    """An rng whose every uniform draw is `value`: 1.0 puts each stratified target at the end of its segment,
    the last one on the total itself, where float rounding sends a real draw at worst."""

    def __init__(self, value: float):
        self.value = value

    def random(self, size: int) -> np.ndarray:
        return np.full(size, self.value)


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_stratified_draws_follow_the_priorities(capacity):
    rng = np.random.default_rng(0)
    priorities = _random_priorities(capacity, rng)
    tree = _tree_over(priorities)
    draws = np.concatenate([tree.sample(128, rng) for _ in range(2_000)])
    assert draws.dtype == np.int64 and draws.shape == (256_000,)
    counts = np.bincount(draws, minlength=capacity)
    positive = priorities > 0
    assert counts[~positive].sum() == 0
    expected = len(draws) * priorities[positive] / priorities.sum()
    chi_square = ((counts[positive] - expected) ** 2 / expected).sum()
    degrees = positive.sum() - 1
    # stratified draws vary less than independent ones: well under the 5-sigma bound of the chi-square
    assert chi_square < degrees + 5 * np.sqrt(2 * degrees), (chi_square, degrees)
    uniform = len(draws) / positive.sum()  # what drawing the positive leaves uniformly would have given
    assert ((counts[positive] - uniform) ** 2 / uniform).sum() > 3 * chi_square


def test_each_draw_falls_in_its_own_segment_of_the_total():
    """Schaul et al.'s stratification: draw k of a batch of B lies in [k, k + 1) * total / B."""
    priorities = np.arange(1.0, 5_001.0)
    tree = _tree_over(priorities)
    leaf_ends = np.cumsum(priorities)  # the running total at the end of each leaf
    for _ in range(20):
        draws = tree.sample(64, np.random.default_rng(_))
        segment = leaf_ends[-1] / 64
        starts, ends = leaf_ends[draws] - priorities[draws], leaf_ends[draws]
        k = np.arange(64)
        assert np.all(starts < (k + 1) * segment + 1e-6) and np.all(ends > k * segment - 1e-6)


@pytest.mark.parametrize("beta", [0.4, 1.0])
def test_importance_weights_match_brute_force(beta):
    rng = np.random.default_rng(1)
    capacity = 5_000
    priorities = _random_priorities(capacity, rng)
    tree = _tree_over(priorities)
    stored = 3_700  # transitions in the buffer: N in (N * P(i)) ** -beta
    draws = tree.sample(256, rng)
    weights = importance_weights(tree.priorities(draws), beta)
    brute = (stored * priorities[draws] / priorities.sum()) ** -beta
    np.testing.assert_allclose(weights, brute / brute.max(), rtol=1e-12)
    assert weights.max() == 1.0


@pytest.mark.parametrize("capacity", [1, 13, FANOUT * TOP_NODES + 3])
def test_all_mass_in_the_last_leaf_draws_only_the_last_leaf(capacity):
    tree = SumTree(capacity)
    tree.update(np.array([capacity - 1]), np.array([0.7]))
    for rng in (np.random.default_rng(2), _LastDraw(0.0), _LastDraw(1.0)):
        assert np.all(tree.sample(100, rng) == capacity - 1)


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_a_draw_at_the_end_of_the_total_lands_on_the_last_positive_leaf(capacity):
    """The last target equals the total: past every node's running sum, at the top and at each level below,
    it must come down on the last leaf with priority > 0, never on a zero leaf after it."""
    priorities = _random_priorities(capacity, np.random.default_rng(3))
    last = capacity // 2
    priorities[last + 1 :] = 0.0
    priorities[last] = 1e-3
    tree = _tree_over(priorities)
    assert tree.sample(1, _LastDraw(1.0)).tolist() == [last]  # the target is the total, exactly
    draws = tree.sample(7, _LastDraw(1.0))
    assert draws[-1] == last
    assert np.all(priorities[draws] > 0)


def test_a_node_whose_sum_exceeds_its_children_sends_the_draw_to_its_last_positive_child():
    """A node's sum and the running sum of its children can differ in the last bit; the draw that lands in that
    difference must take the node's last child with priority > 0 (here the difference is made large)."""
    capacity = FANOUT * TOP_NODES  # one level under the top: top node j sums leaves [j * FANOUT, (j + 1) * FANOUT)
    storage = np.zeros(tree_size(capacity))
    tree = SumTree(capacity, storage)
    node = 3
    tree.update(np.array([node * FANOUT + 2, node * FANOUT + 7]), np.array([1.0, 2.0]))
    storage[1 + node] += 100.0  # the top level lies at [1, 1 + TOP_NODES) of the array
    assert tree.sample(1, _LastDraw(0.999)).tolist() == [node * FANOUT + 7]


def test_zero_priorities_are_never_drawn():
    rng = np.random.default_rng(4)
    capacity = 70_001
    tree = _tree_over(_random_priorities(capacity, rng))
    for _ in range(50):  # priorities move, some to 0, as a learner's updates would
        indices = rng.integers(0, capacity, 128)
        tree.update(indices, np.where(rng.random(128) < 0.5, 0.0, rng.random(128)))
        draws = tree.sample(128, rng)
        assert np.all(tree.priorities(draws) > 0)


def test_a_repeated_index_takes_its_last_priority():
    tree = SumTree(5_000)
    tree.update(np.array([5, 9, 5, 4_999, 5]), np.array([1.0, 2.0, 3.0, 4.0, 6.0]))
    assert tree.priorities(np.array([5, 9, 4_999])).tolist() == [6.0, 2.0, 4.0]
    assert tree.total() == 12.0
    tree.update(np.array([9, 9]), np.array([7.0, 0.0]))
    assert tree.total() == 10.0
    draws = tree.sample(1_000, np.random.default_rng(5))
    assert set(draws.tolist()) == {5, 4_999}


def test_the_total_is_the_sum_of_the_leaves_after_random_updates():
    rng = np.random.default_rng(6)
    capacity = 100_003
    tree = SumTree(capacity)
    leaves = np.zeros(capacity)
    for _ in range(200):
        indices = rng.integers(0, capacity, 256)
        values = rng.exponential(1.0, 256) * (rng.random(256) < 0.9)
        tree.update(indices, values)
        _, last = np.unique(indices[::-1], return_index=True)  # brute force: each index's last value
        leaves[np.unique(indices)] = values[::-1][last]
    np.testing.assert_allclose(tree.total(), leaves.sum(), rtol=1e-12)
    np.testing.assert_array_equal(tree.priorities(np.arange(capacity)), leaves)
    assert tree.max_priority() > 0 and tree.max_priority() >= leaves.max()


def test_the_max_priority_is_a_running_max_that_outlives_the_tree(tmp_path):
    capacity = 20_000
    storage = np.memmap(tmp_path / "priorities", np.float64, "w+", shape=(tree_size(capacity),))
    tree = SumTree(capacity, storage)
    assert tree.max_priority() == 0.0
    tree.update(np.array([0, 1]), np.array([5.0, 2.0]))
    tree.update(np.array([0]), np.array([1.0]))
    assert tree.max_priority() == 5.0  # a running max: lowering the leaf that held it does not lower it
    assert tree.priorities(np.array([0, 1])).tolist() == [1.0, 2.0]
    storage.flush()
    reopened = np.memmap(tmp_path / "priorities", np.float64, "r+", shape=(tree_size(capacity),))
    assert SumTree(capacity, reopened).max_priority() == 5.0


def test_a_second_tree_over_the_same_array_sees_the_same_state(tmp_path):
    """Shared memory: a tree over a second view of the array (a restarted learner's) sees the priorities, the
    total and the max; an update through either view is seen by the other; the same draws from the same seed."""
    capacity = 100_003
    path = tmp_path / "priorities"
    first = SumTree(capacity, np.memmap(path, np.float64, "w+", shape=(tree_size(capacity),)))
    priorities = _random_priorities(capacity, np.random.default_rng(7))
    first.update(np.arange(capacity), priorities)
    second = SumTree(capacity, np.memmap(path, np.float64, "r+", shape=(tree_size(capacity),)))
    assert second.total() == first.total() and second.max_priority() == first.max_priority()
    np.testing.assert_array_equal(second.priorities(np.arange(capacity)), priorities)
    draws = second.sample(128, np.random.default_rng(8))
    np.testing.assert_array_equal(draws, first.sample(128, np.random.default_rng(8)))
    second.update(draws[:10], np.zeros(10))
    np.testing.assert_array_equal(first.priorities(draws[:10]), np.zeros(10))
    assert first.total() == second.total()
    assert not np.isin(first.sample(128, np.random.default_rng(9)), draws[:10]).any()


def test_a_tree_attached_to_an_array_recomputes_the_sums_a_dead_learner_left_behind():
    """A learner that died after writing a leaf and before fixing the sums above it: the next tree over the
    array sums the leaves again, so the total and the draws agree with the leaves."""
    capacity = FANOUT * 1_000  # a multiple of FANOUT: the leaves are the array's last `capacity` floats
    storage = np.zeros(tree_size(capacity))
    SumTree(capacity, storage).update(np.array([10, 20]), np.array([1.0, 1.0]))
    storage[-capacity + 20] = 0.0  # the leaf written, its sums not
    storage[-capacity + 30] = 2.0
    tree = SumTree(capacity, storage)
    assert tree.total() == 3.0
    assert set(tree.sample(100, np.random.default_rng(10)).tolist()) == {10, 30}


@pytest.mark.parametrize(
    "indices, priorities",
    [([0, 1], [1.0, -0.5]), ([0], [np.nan]), ([0], [np.inf]), ([-1], [1.0]), ([5_000], [1.0]), ([0, 1], [1.0])],
)
def test_bad_updates_are_refused_and_change_nothing(indices, priorities):
    tree = SumTree(5_000)
    tree.update(np.array([3]), np.array([1.0]))
    with pytest.raises(ValueError):
        tree.update(np.array(indices), np.array(priorities))
    assert tree.total() == 1.0


def test_sampling_an_empty_tree_is_refused():
    with pytest.raises(ValueError):
        SumTree(100).sample(8, np.random.default_rng(11))


def test_storage_of_the_wrong_size_or_type_is_refused():
    with pytest.raises(ValueError):
        SumTree(100, np.zeros(tree_size(100) + 1))
    with pytest.raises(ValueError):
        SumTree(100, np.zeros(tree_size(100), np.float32))


@pytest.mark.parametrize("way", ["compiled"], indirect=True)  # once: it builds a tree of each way itself
@pytest.mark.parametrize("capacity", CAPACITIES)
def test_the_compiled_and_the_numpy_way_draw_the_same_leaves_and_set_the_same_priorities(capacity):
    """Over one array and the same uniform draws both ways walk the same running sums, so they draw the same
    leaves, rounding cases included; an update by either leaves the same leaves and (to rounding) the same sums."""
    rng = np.random.default_rng(12)
    storage = np.zeros(tree_size(capacity))
    compiled, numpy_way = SumTree(capacity, storage, compiled=True), SumTree(capacity, storage, compiled=False)
    compiled.update(np.arange(capacity), _random_priorities(capacity, rng))
    for seed in range(20):
        for draw in (np.random.default_rng(seed), _LastDraw(1.0), _LastDraw(0.0)):
            uniforms = draw.random(128)
            replay = _LastDraw(0.0)  # both ways read the same 128 uniforms
            replay.random = lambda size, u=uniforms: u[:size]
            np.testing.assert_array_equal(compiled.sample(128, replay), numpy_way.sample(128, replay))
    indices = rng.integers(0, capacity, 300)
    values = rng.exponential(1.0, 300) * (rng.random(300) < 0.8)
    copy = storage.copy()
    compiled.update(indices, values)
    SumTree(capacity, copy, compiled=False).update(indices, values)
    np.testing.assert_array_equal(storage[-capacity:], copy[-capacity:])  # the leaves, the array's last floats
    np.testing.assert_allclose(storage, copy, rtol=1e-12, atol=1e-12)


def test_only_positive_leaves_a_leaf_at_zero_and_the_max_unraised():
    """A learner's new priorities for transitions replaced since they were drawn by ones never to be sampled."""
    tree = SumTree(5_000)
    tree.update(np.array([1, 2, 3]), np.array([1.0, 1.0, 1.0]))
    tree.update(np.array([2]), np.array([0.0]))
    tree.update(np.array([1, 2, 3]), np.array([4.0, 9.0, 0.5]), only_positive=True)
    assert tree.priorities(np.array([1, 2, 3])).tolist() == [4.0, 0.0, 0.5]
    assert tree.total() == 4.5 and tree.max_priority() == 4.0
    tree.update(np.array([2]), np.array([7.0]), only_positive=True)
    assert tree.total() == 4.5 and tree.max_priority() == 4.0
    tree.update(np.array([3, 3]), np.array([0.0, 2.0]), only_positive=True)  # > 0 before the call: the last wins
    assert tree.priorities(np.array([3])).tolist() == [2.0] and tree.total() == 6.0


@pytest.mark.parametrize("way", ["numpy"], indirect=True)  # the kernels unloaded
def test_compiled_without_the_kernels_is_refused():
    with pytest.raises(ValueError, match="compiled"):
        SumTree(100, compiled=True)
