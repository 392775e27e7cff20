"""Whole slots moved between two shared memories (sf_engine.scaleout.slot_transport): a slot sampled by a real
rollout worker and policy worker arrives bit-exact in another run's free slot (observations, versions,
rewards, and the recurrent, turn-based and several-policy fields where a run has them), and a payload
that does not fit is refused before anything is written."""

import numpy as np
import pytest
from conftest import SerialRun, serial_plan

from sf_engine.runtime.shared_buffers import SharedBuffers, slot_fields
from sf_engine.scaleout.slot_transport import ROWS_KEY, PayloadError, pack_slot, unpack_slot


def _sampled(tmp_path, shm_dir, env, *flags, holding=()):
    """(harness, a full slot) of a serial run of `env` after one training step (versions above 0): the
    first slot where every field named in `holding` has a non-zero entry."""
    harness = SerialRun(serial_plan(tmp_path, shm_dir, env, *flags), tmp_path)
    count = harness.cfg.slots_per_batch
    harness.learner.train_on(harness.full_slots(count)[:count])
    for _ in range(20):
        for slot in harness.full_slots(count):
            if all(getattr(harness.buffers, name)[slot].any() for name in holding):
                return harness, slot
    harness.close()
    raise AssertionError(f"no slot held all of {holding}")


def _receiver(tmp_path, layout) -> SharedBuffers:
    return SharedBuffers.create(str(tmp_path / "receiver"), layout)


@pytest.mark.parametrize(
    "env,flags,extra",
    [
        ("CartPole-v1", (), ()),
        ("CartPole-v1", ("--rnn", "gru"), ("episode_start", "rnn_states")),
        ("toy_multiagent:relay_game", ("--pool_every_versions", "1", "--pool_share", "0.5"), ("acting", "policy_id")),
    ],
)
def test_a_sampled_slot_arrives_bit_exact_in_another_slot(tmp_path, shm_dir, env, flags, extra):
    if env.startswith("toy_multiagent"):
        pytest.importorskip("pettingzoo")
    harness, slot = _sampled(tmp_path, shm_dir, env, *flags, holding=extra)
    receiver = None
    try:
        receiver = _receiver(tmp_path, harness.buffers.layout)
        payload = pack_slot(harness.buffers, slot)
        for name in extra:  # each field the run adds travels, and holds something to compare
            assert payload[name].any(), name
        assert harness.buffers.policy_version[slot].max() >= 1, "no version tag to carry"
        target = receiver.slot_owner.shape[0] - 1
        steps = unpack_slot(receiver, target, payload)
        assert steps == harness.buffers.slot_rows[slot] * receiver.log_probs.shape[2] > 0
        for name in slot_fields(receiver.layout):
            sent = harness.buffers.obs[name[4:]] if name.startswith("obs.") else getattr(harness.buffers, name)
            got = receiver.obs[name[4:]] if name.startswith("obs.") else getattr(receiver, name)
            assert got[target].tobytes() == sent[slot].tobytes(), name
            assert not got[:target].any(), f"{name}: written outside the target slot"
        assert receiver.slot_rows[target] == harness.buffers.slot_rows[slot]
    finally:
        if receiver is not None:
            receiver.release()
        harness.close()


def test_a_payload_that_does_not_fit_is_refused_before_anything_is_written(tmp_path, shm_dir):
    harness, slot = _sampled(tmp_path, shm_dir, "CartPole-v1")
    receiver = None
    try:
        receiver = _receiver(tmp_path, harness.buffers.layout)
        good = pack_slot(harness.buffers, slot)
        latest = int(good["policy_version"].max())
        bad = {
            "missing field": {k: v for k, v in good.items() if k != "rewards"},
            "extra field": good | {"acting": np.zeros(good["rewards"].shape, bool)},
            "wrong dtype": good | {"rewards": good["rewards"].astype(np.float64)},
            "wrong shape": good | {"obs.obs": good["obs.obs"][:-1]},
            "objects": good | {"valid": np.array([object()] * 3)},
            "not an array": good | {"values": good["values"].tolist()},
            "too many rows": good | {ROWS_KEY: np.array(10**6, np.int64)},
            "a subclass": good | {"values": np.ma.masked_array(good["values"])},
            "keys of two types": good | {1: good["values"]},
            "a version not published": good | {"policy_version": good["policy_version"] + 1},
            "a negative version": good | {"policy_version": good["policy_version"] - latest - 1},
            "a NaN reward": good | {"rewards": np.full_like(good["rewards"], np.nan)},
        }
        for case, payload in bad.items():
            with pytest.raises(PayloadError) as error:
                unpack_slot(receiver, 0, payload, latest_version=latest)
            assert "\n" not in str(error.value), case
            assert not receiver.rewards.any() and not receiver.obs["obs"].any() and not receiver.slot_rows.any(), case
        with pytest.raises(PayloadError):
            unpack_slot(receiver, 0, [good])
        for slot_index in (-1, receiver.slot_owner.shape[0]):
            with pytest.raises(PayloadError, match="not a free slot"):
                unpack_slot(receiver, slot_index, good)
        receiver.slot_owner[0] = 1  # a local worker is filling it
        with pytest.raises(PayloadError, match="not a free slot"):
            unpack_slot(receiver, 0, good)
        assert not receiver.rewards.any()
        assert unpack_slot(receiver, 1, good, latest_version=latest) > 0
    finally:
        if receiver is not None:
            receiver.release()
        harness.close()


def test_policy_ids_outside_the_run_are_refused(tmp_path, shm_dir):
    pytest.importorskip("pettingzoo")
    harness, slot = _sampled(tmp_path, shm_dir, "toy_multiagent:relay_game", "--pool_every_versions", "1")
    receiver = None
    try:
        receiver = _receiver(tmp_path, harness.buffers.layout)
        payload = pack_slot(harness.buffers, slot)
        payload["policy_id"] = np.full_like(payload["policy_id"], harness.cfg.policies.num_acting)
        with pytest.raises(PayloadError, match="policy ids"):
            unpack_slot(receiver, 0, payload)
        assert not receiver.policy_id.any()
    finally:
        if receiver is not None:
            receiver.release()
        harness.close()
