"""The replay buffer (sf_engine/replay/buffer.py) and its rate limiter (sf_engine/replay/rate_limiter.py) over plain
NumPy arrays laid out by replay_layout: every sampled transition against n_step_transitions on a slot with both
kinds of episode end, reset steps and a skipped step; the ring's wrap-around and a restarted learner's buffer over
the same arrays; prioritized sampling, its importance weights and late priority updates; save and load; the replay
ratio the limiter holds."""

import os
import zipfile

import numpy as np
import pytest

from sf_engine.algo.value_targets import n_step_transitions
from sf_engine.config.groups import Config, LearnerConfig, SamplerConfig
from sf_engine.config.value import ReplayConfig
from sf_engine.envs import ActionSpec, EnvSpec
from sf_engine.replay.buffer import PRIORITY_EPS, ReplayBuffer
from sf_engine.replay.layout import (
    REPLAY_FILLED,
    REPLAY_INSERTED,
    REPLAY_NEXT,
    REPLAY_SAMPLED,
    replay_layout,
    replay_prefix,
)
from sf_engine.replay.rate_limiter import RateLimiter
from sf_engine.replay.transform import SlotSteps
from sf_engine.replay.transitions import NStepTransitions

T, E = 8, 3  # rollout, envs per slot
GAMMA, N_STEP, ALPHA = 0.9, 3, 0.6
SPEC = EnvSpec(obs=(("pixels", (1, 2, 2), "uint8"), ("obs", (2,), "float32")), action=ActionSpec("discrete", nvec=(5,)))


def synthetic_slot(index: int) -> SlotSteps:
    """Slot number `index` (< 9) whose every observation names its (slot, row, env). Env 0: terminated at step 2,
    truncated at step 6, each followed by its reset step (valid False). Env 1: starts on a reset step (the previous
    slot's episode ended on its last step) and skips step 4 (valid False, no done: a non-finite value). Env 2:
    truncated at step 0 (reset at 1), terminated on the slot's last step, so bootstrap row T is its last obs."""
    rows, envs = np.meshgrid(np.arange(T + 1), np.arange(E), indexing="ij")  # [T+1, E]
    code = (index * (T + 1) + rows) * E + envs  # distinct per (slot, row, env), < 256
    obs = {
        "pixels": np.broadcast_to(code[:, :, None, None, None], (T + 1, E, 1, 2, 2)).astype(np.uint8),
        "obs": np.stack([rows, envs], axis=-1).astype(np.float32) + 1000 * index,
    }
    steps, envs = np.meshgrid(np.arange(T), np.arange(E), indexing="ij")  # [T, E]
    terminated, truncated, valid = np.zeros((T, E), bool), np.zeros((T, E), bool), np.ones((T, E), bool)
    terminated[2, 0], truncated[6, 0], valid[[3, 7], 0] = True, True, False
    valid[[0, 4], 1] = False
    truncated[0, 2], valid[1, 2], terminated[7, 2] = True, False, True
    rewards = (np.random.default_rng(index).normal(size=(T, E)) * valid).astype(np.float32)
    return SlotSteps(obs, steps * E + envs, rewards, terminated, truncated, valid, 100 * index + steps)


def targets_of(slot: SlotSteps):
    return n_step_transitions(slot.rewards, slot.terminated, slot.truncated, slot.valid, GAMMA, N_STEP)


def replay_arrays(columns: int, prioritized: bool = False) -> dict:
    """The buffer's arrays of a run with `columns` columns of T steps, as SharedBuffers.replay names them."""
    cfg = Config(
        learner=LearnerConfig(algo="dqn"),
        sampler=SamplerConfig(rollout=T),
        replay=ReplayConfig(replay_size=columns * T, prioritized=prioritized),
    )
    layout = replay_layout(cfg, SPEC)
    return {name.removeprefix(replay_prefix(0)): np.zeros(shape, dtype) for name, (shape, dtype) in layout.items()}


def make_buffer(arrays: dict, seed: int = 0) -> ReplayBuffer:
    return ReplayBuffer(arrays, NStepTransitions(GAMMA, N_STEP), "priorities" in arrays, ALPHA, seed)


def check_transitions(sample, owners: dict) -> None:
    """Every transition of `sample` is the n-step transition of the slot and env whose trajectory its column
    holds (`owners`: column -> (slot index, env)), trainable, and its window crosses no episode end or reset."""
    columns, steps = np.divmod(sample.indices, T)
    for i, (column, t) in enumerate(zip(columns, steps)):
        index, env = owners[column]
        slot = synthetic_slot(index)
        targets = targets_of(slot)
        n = targets.steps[t, env]
        assert targets.trainable[t, env] and 1 <= n <= N_STEP and t + n <= T
        assert not (slot.terminated | slot.truncated)[t : t + n - 1, env].any()  # no end before the window's last
        assert slot.valid[t : t + n, env].all()  # no reset step, no skipped step inside the window
        for key, rows in slot.obs.items():
            np.testing.assert_array_equal(sample.obs[key][i], rows[t, env])
            np.testing.assert_array_equal(sample.next_obs[key][i], rows[t + n, env])
        assert sample.actions[i] == slot.actions[t, env]
        assert sample.returns[i] == targets.returns[t, env]
        assert sample.discounts[i] == targets.discounts[t, env]
        assert sample.policy_version[i] == slot.policy_version[t, env]


def test_the_synthetic_slot_is_what_its_docstring_says():
    """Hand-checked windows of the slot the other tests sample from (the slot's bootstrap row included)."""
    targets = targets_of(synthetic_slot(0))
    assert (targets.steps[1, 0], targets.discounts[1, 0]) == (2, 0.0)  # ends on the terminated step 2
    assert targets.steps[5, 0] == 2 and targets.discounts[5, 0] == np.float32(GAMMA**2)  # truncated at 6
    assert targets.steps[7, 1] == 1 and targets.discounts[7, 1] == np.float32(GAMMA)  # bootstraps from row T
    assert targets.steps[5, 1] == 3 and not targets.trainable[[0, 2, 3, 4], 1].any()  # around the skipped step
    assert (targets.steps[7, 2], targets.discounts[7, 2]) == (1, 0.0)  # terminated on the last step
    assert not targets.trainable[[3, 7], 0].any() and not targets.trainable[1, 2]  # the reset steps


@pytest.mark.parametrize("prioritized", [False, True])
def test_every_sampled_transition_is_its_envs_n_step_transition(prioritized):
    arrays = replay_arrays(E, prioritized)
    buffer = make_buffer(arrays)
    assert buffer.insert(synthetic_slot(0)) == T * E
    seen = set()
    for _ in range(100):
        sample = buffer.sample(64, beta=0.4)
        check_transitions(sample, {env: (0, env) for env in range(E)})
        assert sample.obs["pixels"].dtype == np.uint8 and sample.obs["pixels"].shape == (64, 1, 2, 2)
        assert sample.next_obs["obs"].dtype == np.float32 and sample.actions.shape == (64,)
        assert sample.weights.dtype == np.float32 and (sample.weights == 1.0).all()  # every priority still 1
        seen |= set(sample.indices.tolist())
    assert seen == set(np.flatnonzero(targets_of(synthetic_slot(0)).trainable.T))  # all the trainable, no other


def test_the_ring_overwrites_the_oldest_columns_and_a_restarted_learner_sees_the_same():
    columns = 5
    arrays = replay_arrays(columns)
    buffer = make_buffer(arrays)
    owners = {}
    for index in range(4):  # 12 trajectories through 5 columns
        buffer.insert(synthetic_slot(index))
        owners |= {(index * E + env) % columns: (index, env) for env in range(E)}
        assert arrays["counters"][REPLAY_NEXT] == (index + 1) * E % columns
        assert arrays["counters"][REPLAY_FILLED] == min(columns, (index + 1) * E)
        assert buffer.size == min(columns, (index + 1) * E) * T <= buffer.capacity
    for column, (index, env) in owners.items():
        np.testing.assert_array_equal(arrays["obs.pixels"][column], synthetic_slot(index).obs["pixels"][:, env])
    check_transitions(buffer.sample(256, beta=1.0), owners)

    restarted = make_buffer(arrays, seed=1)  # a new learner over the same shared arrays
    assert (restarted.size, restarted.capacity) == (columns * T, buffer.capacity)
    check_transitions(restarted.sample(256, beta=1.0), owners)
    restarted.insert(synthetic_slot(4))  # goes on at column 12 % 5 = 2
    owners |= {(12 + env) % columns: (4, env) for env in range(E)}
    assert arrays["counters"][REPLAY_NEXT] == 0 and arrays["counters"][REPLAY_FILLED] == columns
    assert restarted.size == columns * T
    check_transitions(restarted.sample(256, beta=1.0), owners)


def priorities_of(buffer: ReplayBuffer) -> np.ndarray:
    return buffer.tree.priorities(np.arange(buffer.capacity))


def test_new_transitions_enter_at_the_running_max_priority_and_the_untrainable_at_zero():
    arrays = replay_arrays(2 * E, prioritized=True)
    buffer = make_buffer(arrays)
    buffer.insert(synthetic_slot(0))
    trainable = targets_of(synthetic_slot(0)).trainable.T.reshape(-1)  # flat index = column x T + t
    np.testing.assert_array_equal(priorities_of(buffer)[: E * T], np.where(trainable, 1.0, 0.0))
    assert (priorities_of(buffer)[E * T :] == 0).all()
    indices = np.flatnonzero(trainable)
    td_errors = np.linspace(-3.0, 2.0, len(indices))
    buffer.update_priorities(indices, td_errors)
    expected = (np.abs(td_errors) + PRIORITY_EPS) ** ALPHA
    np.testing.assert_allclose(priorities_of(buffer)[indices], expected)
    buffer.update_priorities(indices[:1], np.zeros(1))  # the leaf that set the max falls: the max stays
    buffer.insert(synthetic_slot(1))  # into columns E .. 2E-1
    np.testing.assert_allclose(priorities_of(buffer)[E * T :], np.where(trainable, expected.max(), 0.0))
    assert expected.max() > 1.0


def test_prioritized_sampling_follows_the_td_errors_and_weights_correct_for_it():
    buffer = make_buffer(replay_arrays(E, prioritized=True), seed=3)
    buffer.insert(synthetic_slot(0))
    indices = np.flatnonzero(targets_of(synthetic_slot(0)).trainable.T)
    td_errors = np.random.default_rng(0).uniform(-2.0, 2.0, len(indices))
    td_errors[0] = 0.0  # priority eps ** alpha: drawn, rarely
    buffer.update_priorities(indices, td_errors)
    priorities = (np.abs(td_errors) + PRIORITY_EPS) ** ALPHA
    draws = []
    for beta in np.linspace(0.0, 1.0, 2_000):
        sample = buffer.sample(64, beta)
        draws.append(sample.indices)
        chosen = priorities[np.searchsorted(indices, sample.indices)]
        weights = (buffer.size * chosen / priorities.sum()) ** -beta
        np.testing.assert_allclose(sample.weights, weights / weights.max(), rtol=1e-6)
    counts = np.bincount(np.concatenate(draws), minlength=buffer.capacity)
    assert counts.sum() == counts[indices].sum()  # nothing untrainable
    expected = counts.sum() * priorities / priorities.sum()
    chi_square = ((counts[indices] - expected) ** 2 / expected).sum()
    degrees = len(indices) - 1
    assert chi_square < degrees + 5 * np.sqrt(2 * degrees), chi_square
    uniform = counts.sum() / len(indices)
    assert ((counts[indices] - uniform) ** 2 / uniform).sum() > 20 * chi_square


def test_a_late_priority_update_gives_no_priority_to_a_transition_replaced_by_an_untrainable_one():
    arrays = replay_arrays(E, prioritized=True)  # full after one slot: the next overwrites every column
    buffer = make_buffer(arrays)
    buffer.insert(synthetic_slot(0))
    stale = buffer.sample(256, beta=0.4)
    newer = synthetic_slot(1)
    newer.valid[:, 1] = False  # env 1 absent throughout: none of column 1's transitions is trainable any more
    buffer.insert(newer)
    assert (stale.indices // T == 1).any()
    buffer.update_priorities(stale.indices, np.full(len(stale.indices), 5.0))
    trainable = targets_of(newer).trainable.T.reshape(-1)
    assert (priorities_of(buffer)[~trainable] == 0).all()
    assert (priorities_of(buffer)[trainable] > 0).all()
    owners = {env: (1, env) for env in range(E)}
    for _ in range(20):
        sample = buffer.sample(64, beta=0.4)
        assert not (sample.indices // T == 1).any()
        check_transitions(sample, owners)


def filled_buffer(columns: int, seed: int = 0) -> ReplayBuffer:
    """A prioritized buffer of `columns` columns that holds two slots and some updated priorities."""
    buffer = make_buffer(replay_arrays(columns, prioritized=True), seed)
    buffer.insert(synthetic_slot(0))
    buffer.insert(synthetic_slot(1))
    sample = buffer.sample(32, beta=0.4)
    buffer.update_priorities(sample.indices, np.linspace(0.0, 4.0, 32))
    buffer.arrays["counters"][REPLAY_INSERTED], buffer.arrays["counters"][REPLAY_SAMPLED] = 2 * T * E, 32
    return buffer


def test_save_and_load_round_trip(tmp_path):
    saved = filled_buffer(2 * E)
    path = str(tmp_path / "replay.npz")
    saved.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["replay.npz"]  # no temporary file left
    loaded = make_buffer(replay_arrays(2 * E, prioritized=True))
    message = loaded.load(path)
    assert message == f"replay buffer refilled from {path}: {2 * E * T} transitions"
    for name, array in saved.arrays.items():
        np.testing.assert_array_equal(loaded.arrays[name], array, err_msg=name)
    assert loaded.tree.total() == saved.tree.total() > 0
    first, second = (
        make_buffer(saved.arrays, seed=5).sample(64, 0.5),
        make_buffer(loaded.arrays, seed=5).sample(64, 0.5),
    )
    np.testing.assert_array_equal(first.indices, second.indices)
    np.testing.assert_array_equal(first.weights, second.weights)
    with np.load(path, allow_pickle=False) as stored:  # plain arrays only: nothing pickled
        assert set(stored.files) == set(saved.arrays)
        assert all(stored[name].dtype != object for name in stored.files)


def test_a_buffer_of_another_capacity_refuses_the_file_and_stays_as_it_was(tmp_path):
    path = str(tmp_path / "replay.npz")
    filled_buffer(2 * E).save(path)
    for other in (make_buffer(replay_arrays(E, prioritized=True)), filled_buffer(3 * E, seed=1)):
        before = {name: array.copy() for name, array in other.arrays.items()}
        message = other.load(path)
        assert message.startswith(f"replay buffer {path} not loaded: ") and "\n" not in message
        assert "does not fit this run's buffer" in message
        for name, array in other.arrays.items():
            np.testing.assert_array_equal(array, before[name], err_msg=name)


def _flip_last_byte_of(path: str, member: str) -> None:
    """Corrupt the last data byte of one array of a saved .npz (its CRC no longer matches)."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_length, extra_length = np.frombuffer(f.read(4), "<u2")
        f.seek(info.header_offset + 30 + int(name_length) + int(extra_length) + info.compress_size - 1)
        byte = f.read(1)[0]
        f.seek(-1, 1)
        f.write(bytes([byte ^ 0xFF]))


def _rewrite(path: str, keep_bytes: int, then: bytes = b"") -> None:
    """Keep the first `keep_bytes` bytes of the file, then write `then`."""
    with open(path, "r+b") as f:
        f.truncate(keep_bytes)
        f.seek(keep_bytes)
        f.write(then)


CORRUPTIONS = {
    "truncated": lambda path: _rewrite(path, os.path.getsize(path) // 2),
    "empty": lambda path: _rewrite(path, 0),
    "not a zip": lambda path: _rewrite(path, 0, b"\x80\x04garbage" * 100),
    "obs bytes": lambda path: _flip_last_byte_of(path, "obs.pixels.npy"),
    "priorities bytes": lambda path: _flip_last_byte_of(path, "priorities.npy"),  # stored after the counters
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_corrupt_file_raises_and_leaves_the_buffer_empty(tmp_path, corruption):
    """ReplaySource.load catches what comes out (a zipfile.BadZipFile, an EOFError or a ValueError) and
    refills from the envs: the buffer must then be empty, not half loaded (counters that promise data the
    priorities do not hold would fail every prioritized sample)."""
    path = str(tmp_path / "replay.npz")
    columns = 80  # priorities past the 4 KiB a zip member reads ahead: a bad CRC shows only once it is copied
    filled_buffer(columns).save(path)
    CORRUPTIONS[corruption](path)
    buffer = make_buffer(replay_arrays(columns, prioritized=True))
    with pytest.raises((zipfile.BadZipFile, EOFError, ValueError)) as raised:
        buffer.load(path)
    assert "pickle" not in str(raised.value)  # no advice to unpickle an unknown file
    assert buffer.size == 0 and (buffer.arrays["counters"] == 0).all() and buffer.tree.total() == 0
    limiter = RateLimiter(buffer.counters, replay_ratio=8.0, learning_starts=0, batch_size=32)
    assert not limiter.can_train()  # it trains again only once the envs refilled it


def simulate(limiter: RateLimiter, slot_steps: int, until_inserted: int) -> list:
    """The learner's loop: train a batch while the limiter allows one, else insert a slot of `slot_steps` env
    steps. Returns the ratio's deficit, ratio x (inserted - learning_starts) - sampled, each time it inserts
    after learning started; checks on the way that nothing trains before learning_starts or runs ahead."""
    deficits = []
    while True:
        if limiter.can_train():
            assert limiter.inserted >= limiter.learning_starts
            limiter.trained(limiter.batch_size)
            assert limiter.allowance() >= 0  # never ahead of the ratio
            continue
        if limiter.inserted <= limiter.learning_starts:
            assert limiter.sampled == 0 and limiter.replay_ratio() is None
        else:
            deficits.append(limiter.allowance())
        if limiter.inserted >= until_inserted:
            return deficits
        limiter.inserted_steps(slot_steps)


@pytest.mark.parametrize("batch_size", [32, 128, 512])
@pytest.mark.parametrize("ratio", [0.25, 1.0, 8.0, 32.0])
def test_the_rate_limiter_holds_the_replay_ratio_within_one_batch(ratio, batch_size):
    learning_starts, slot_steps = 1_000, 96  # learning_starts not a multiple of a slot
    counters = np.zeros(4, np.int64)
    limiter = RateLimiter(counters, ratio, learning_starts, batch_size)
    until = learning_starts + max(5_000, int(32 * batch_size / ratio))  # at least 31 batches trained
    deficits = simulate(limiter, slot_steps, until)
    assert limiter.sampled >= 30 * batch_size and counters[REPLAY_SAMPLED] == limiter.sampled
    assert all(0 <= deficit < batch_size for deficit in deficits)  # when it inserts: within one batch
    steps = limiter.inserted - learning_starts
    assert abs(limiter.replay_ratio() - ratio) < batch_size / steps
    restarted = RateLimiter(counters, ratio, learning_starts, batch_size)  # a restarted learner: same books
    assert restarted.replay_ratio() == limiter.replay_ratio() and not restarted.can_train()


def test_nothing_trains_before_learning_starts():
    counters = np.zeros(4, np.int64)
    limiter = RateLimiter(counters, 32.0, learning_starts=500, batch_size=32)
    assert limiter.replay_ratio() is None and not limiter.started
    limiter.inserted_steps(499)
    assert not limiter.can_train() and not limiter.started and limiter.replay_ratio() is None
    limiter.inserted_steps(1)
    assert limiter.started and not limiter.can_train() and limiter.replay_ratio() is None
    limiter.inserted_steps(1)  # 32 samples allowed: one batch
    assert limiter.can_train()
    limiter.trained(32)
    assert not limiter.can_train() and limiter.replay_ratio() == 32.0


def test_a_refilled_buffer_is_rebased_on_this_runs_ratio():
    """--save_replay, resumed with another --replay_ratio: the limiter starts balanced at the new ratio (no
    backlog of training with sampling stopped, no stretch of inserts without training)."""
    counters = np.zeros(4, np.int64)
    counters[REPLAY_INSERTED], counters[REPLAY_SAMPLED] = 10_000, 10_000  # trained at ratio 1 before
    limiter = RateLimiter(counters, replay_ratio=8.0, learning_starts=1_000, batch_size=32)
    limiter.rebase()
    assert limiter.sampled == 72_000 and not limiter.can_train()
    limiter.inserted_steps(4)
    assert limiter.can_train() and limiter.allowance() == 32
    counters[REPLAY_INSERTED] = 500  # still before --learning_starts: nothing counts as trained
    limiter.rebase()
    assert limiter.sampled == 0
