"""Shared trajectory slots: cross-process visibility, slot ownership, release of the segment."""

import multiprocessing
import os

import numpy as np
import pytest
from conftest import SerialRun

from sf_engine.envs import ActionSpec, EnvSpec
from sf_engine.run.plan import build_plan
from sf_engine.runtime.ipc import get_many
from sf_engine.runtime.shared_buffers import SharedBuffers, buffer_layout


def small_plan(tmp_path):
    return build_plan(
        [
            "--num_workers",
            "2",
            "--num_envs_per_worker",
            "8",
            "--rollout",
            "4",
            "--batch_size",
            "16",
            "--num_batches_per_epoch",
            "2",
            "--train_dir",
            str(tmp_path),
            "--mode",
            "serial",
        ]
    )


def _child_writes(path, layout, slot):
    buffers = SharedBuffers.attach(path, layout)
    obs = buffers.obs["obs"]
    obs[slot] = np.arange(obs[slot].size, dtype=np.float32).reshape(obs[slot].shape)
    buffers.actions[slot] = 7
    buffers.valid[slot] = True


def test_slot_written_in_one_process_is_read_intact_in_another(tmp_path):
    cfg = small_plan(tmp_path).cfg
    layout = buffer_layout(
        cfg, EnvSpec(obs=(("obs", (3, 2), "float32"),), action=ActionSpec("discrete", nvec=(2,))), state=0
    )
    path = str(tmp_path / "shm_segment")
    buffers = SharedBuffers.create(path, layout)
    process = multiprocessing.get_context("spawn").Process(target=_child_writes, args=(path, layout, 1))
    process.start()
    process.join(60)
    assert process.exitcode == 0
    obs = buffers.obs["obs"]
    expected = np.arange(obs[1].size, dtype=np.float32).reshape(obs[1].shape)
    np.testing.assert_array_equal(obs[1], expected)
    assert (buffers.actions[1] == 7).all() and buffers.valid[1].all()
    assert (obs[0] == 0).all() and (buffers.actions[0] == 0).all()  # other slots untouched
    buffers.release()
    assert not os.path.exists(path)


def _free_queue_contents(queues) -> list:
    slots = get_many(queues.free_slots, 0)
    if slots:
        queues.free_slots.put_many(slots)
    return slots


def test_no_slot_is_handed_out_twice(tmp_path):
    """Every slot is, at any moment, in exactly one place: the free queue, a split being filled, the
    full queue on its way to the learner, or the learner's batch."""
    run = SerialRun(small_plan(tmp_path), tmp_path)
    cfg, queues, learner, policy, workers = run.cfg, run.queues, run.learner, run.policy, run.workers
    trained_batches = 0
    for _ in range(300):
        for worker in workers:
            worker.step(0)
        policy.step(0)
        full = get_many(queues.full_slots, 0)
        places = [s for w in workers for s in w.slot if s >= 0] + full + learner.source.pending
        places += _free_queue_contents(queues)
        assert sorted(places) == list(range(cfg.num_slots)), places
        if full:
            queues.full_slots.put_many(full)
        version = learner.version
        learner.step(0)
        trained_batches += learner.version - version
    assert trained_batches >= 5
    run.close()


def test_the_segment_is_created_exclusively_never_through_a_link(tmp_path):
    from sf_engine.runtime.shared_buffers import shm_path

    layout = {"stop": ((1,), "int64"), "slot_owner": ((4,), "int64")}
    names = {os.path.basename(shm_path(str(tmp_path), "/x/train_dir/exp")) for _ in range(3)}
    assert len(names) == 3 and all(name.startswith("sf_engine_exp_") for name in names)  # new per run
    taken = tmp_path / "taken"
    taken.write_bytes(b"")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "target")
    for path in (taken, link):
        with pytest.raises(OSError):
            SharedBuffers.create(str(path), layout)
    assert not (tmp_path / "target").exists()
    buffers = SharedBuffers.create(str(tmp_path / "segment"), layout)
    assert os.stat(tmp_path / "segment").st_mode & 0o777 == 0o600
    buffers.release()


def test_leftovers_are_removed_only_when_they_are_this_experiments(tmp_path):
    """A processes.json counts only for the very directory it was written in (a copied experiment folder
    or one from elsewhere does not), only while its main process is gone, and then kills only processes
    whose pid, start time and command line all match; the dead run's segment goes with them."""
    import json
    import shutil
    import subprocess
    import sys
    import time

    import psutil

    from sf_engine.run.experiment import _identity, _remove_leftovers, started_sec

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        process = psutil.Process(child.pid)
        deadline = time.monotonic() + 10
        while not process.cmdline() and time.monotonic() < deadline:  # /proc reads it empty for a moment after exec
            time.sleep(0.01)
        row = {
            "role": "rollout_worker",
            "index": 0,
            "pid": child.pid,
            "started_sec": started_sec(process),
            "cmdline": process.cmdline(),
        }
        me = psutil.Process()
        runner = {"role": "runner", "index": 0, "pid": me.pid, "started_sec": started_sec(me), "cmdline": me.cmdline()}
        exp, shm = tmp_path / "exp", tmp_path / "shm"
        exp.mkdir(), shm.mkdir()
        segment = shm / "sf_engine_exp_0123456789abcdef"
        segment.write_bytes(b"x")

        def write(rows, identity):
            (exp / "processes.json").write_text(
                json.dumps({"processes": rows, "shm_path": str(segment), "experiment": identity})
            )
            return _remove_leftovers(str(exp), str(shm))

        copy = tmp_path / "copy"
        shutil.copytree(exp, copy)
        assert write([row], _identity(str(copy))) == []  # written for another directory: ignored
        assert write([row, runner], _identity(str(exp))) == []  # its main process lives: a live run
        assert (
            write([{**row, "cmdline": ["python", "other"]}], _identity(str(exp)))
            == [f"removed {segment} left by a previous run"]
            and child.poll() is None
        )  # another program: kept
        segment.write_bytes(b"x")
        assert len(write([row], _identity(str(exp)))) == 2 and child.wait(timeout=10) is not None
        assert not segment.exists()
    finally:
        child.kill()
        child.wait()


def test_the_trajectory_batch_holds_every_slot_field(tmp_path):
    """SLOT_FIELDS is the one list of a slot's fields: the learner's TrajectoryBatch has a field for each
    (after the observations), in the same order, then the learner's `keep` mark, and a feed-forward
    single-agent run's buffers lay out its observations and exactly the fields every run has."""
    import dataclasses

    from sf_engine.algo.batch import ALWAYS, SLOT_FIELDS, TrajectoryBatch
    from sf_engine.runtime.shared_buffers import slot_fields

    assert [f.name for f in dataclasses.fields(TrajectoryBatch)] == ["obs"] + [f.name for f in SLOT_FIELDS] + ["keep"]
    always = [f.name for f in SLOT_FIELDS if f.present == ALWAYS]
    assert list(slot_fields(small_plan(tmp_path).layout)) == ["obs.obs"] + always
