"""A learner (or evaluator) that dies is restarted from what it left: the whole training state it kept beside the
run's shared memory (tests/test_kept_state.py), else the weights it published last (they outlive it in the run's
shared-memory file) and its last checkpoint; with the restarts spent, that state becomes a checkpoint the next run
resumes from."""

import os
import re
import signal

import numpy as np
import pytest
import torch
from conftest import read_json
from test_reliability import (  # noqa: F401  (no_leftover_runs: the autouse fixture that kills what a test left)
    ASYNC,
    books_balance,
    no_leftover_runs,
    start_train,
    wait_for,
    wait_for_children,
    wait_for_steps,
)

from sf_engine.runtime.checkpoint import env_steps_of, list_checkpoints, load_checkpoint, policy_states
from sf_engine.runtime.ipc import LocalChannel
from sf_engine.runtime.shared_buffers import SharedBuffers
from sf_engine.runtime.weights import SharedWeights

RECOVERED = re.compile(r"policy 0 version (\d+) with the training state of version \d+, kept [\d.]+ s before")


def _kill(rows, role):
    os.kill(next(r["pid"] for r in rows if r["role"] == role), signal.SIGKILL)


def _version_now(exp_dir) -> int:
    return read_json(os.path.join(exp_dir, "summary.json"))["learner_version"]


@pytest.mark.e2e
def test_a_killed_learner_is_restarted_with_its_version_and_weights(tmp_path, shm_dir):
    """SIGKILL of the learner (before any checkpoint) and of the evaluator: both come back, the learner at
    the version it had published with the training state it kept (its weights and optimizer state, not from
    scratch), and the run ends on its budget."""
    exp = str(tmp_path / "learner")
    args = ["--shm_dir", shm_dir, "--train_for_env_steps", "400000", "--train_for_seconds", "120"]
    args += ["--save_every_sec", "1000", "--eval_every_sec", "2", "--eval_episodes", "2"]
    proc = start_train(ASYNC + args, tmp_path, "learner")
    rows = wait_for_children(exp, 5)
    wait_for_steps(exp, 60_000)
    published = _version_now(exp)
    _kill(rows, "learner")
    wait_for(exp, "learner_restarts", 1)
    _kill(rows, "evaluator")
    wait_for(exp, "evaluator_restarts", 1)
    evaluated = read_json(os.path.join(exp, "summary.json"))["eval_version"] or 0
    wait_for(exp, "eval_version", evaluated + 1)  # the restarted evaluator evaluates newer weights
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    summary = read_json(os.path.join(exp, "summary.json"))
    assert (summary["learner_restarts"], summary["evaluator_restarts"]) == (1, 1), out
    recovered = RECOVERED.search(summary["learner_recoveries"][0])
    assert recovered, summary["learner_recoveries"]
    assert int(recovered.group(1)) >= published > 0  # carried over, not started again at version 0
    assert "optimizer moments" in summary["learner_recoveries"][0]  # not a new optimizer state
    assert summary["learner_version"] > int(recovered.group(1))  # and training went on
    assert "env-step budget reached" in out
    books_balance(summary)  # the batch the dead learner held (if any) booked as dropped
    assert os.listdir(shm_dir) == []


@pytest.mark.e2e
def test_a_killed_dqn_learner_goes_on_from_the_replay_buffer_with_every_env_step_booked(tmp_path, shm_dir):
    """--algo dqn with prioritized replay: SIGKILL of the learner while it trains. The buffer, its priorities and
    the books of the env steps inserted and not yet reported live in the shared memory, so the restarted learner
    goes on training from them, and at the stop every env step is booked (the dead learner's inserts included)."""
    exp = str(tmp_path / "dqn")
    args = ["--algo", "dqn", "--prioritized", "true", "--shm_dir", shm_dir, "--train_for_env_steps", "80000"]
    proc = start_train(args + ["--train_for_seconds", "120", "--save_every_sec", "1000"], tmp_path, "dqn")
    rows = wait_for_children(exp, 3)  # the learner, the policy worker, one rollout worker
    wait_for_steps(exp, 20_000)  # well past --learning_starts: training
    _kill(rows, "learner")
    wait_for(exp, "learner_restarts", 1)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    summary = read_json(os.path.join(exp, "summary.json"))
    assert summary["learner_restarts"] == 1 and "env-step budget reached" in out, out
    assert summary["learner_version"] > int(RECOVERED.search(summary["learner_recoveries"][0]).group(1))
    books = books_balance(summary)
    assert books["inserted_replay"] > 60_000 and books["trained"] == 0, books
    assert abs(summary["replay_ratio"] - 8.0) < 0.5, summary["replay_ratio"]  # the limiter's counters carried over
    assert os.listdir(shm_dir) == []


def test_a_replay_report_sent_again_by_the_next_learner_is_counted_once():
    """A learner killed after sending a report and before clearing its books leaves them in shared memory; the
    next one sends them again with what it inserted since, under the same report number: only that is new."""
    from types import SimpleNamespace

    from sf_engine.stats.books import ReplayReports

    def report(number, inserted, not_trainable, skipped):
        return SimpleNamespace(
            report_number=number, inserted=inserted, not_trainable=not_trainable, skipped_non_finite=skipped
        )

    reports = ReplayReports()
    assert reports.not_counted(report(1, 128, 2, 0)) == (128, 2, 0)
    assert reports.not_counted(report(2, 256, 0, 1)) == (256, 0, 1)
    assert reports.not_counted(report(2, 384, 3, 1)) == (128, 3, 0)  # report 2 again, with a slot more
    assert reports.not_counted(report(3, 128, 0, 0)) == (128, 0, 0)


@pytest.mark.e2e
def test_with_the_restarts_spent_the_last_published_weights_become_a_checkpoint(tmp_path, shm_dir):
    """--max_worker_restarts 0: the learner's death stops the run, but what it left (the training state it kept,
    at the version it published last) is written as a checkpoint (finite, at that version) that the same command
    resumes from."""
    exp = str(tmp_path / "spent")
    args = ["--shm_dir", shm_dir, "--train_for_env_steps", "2000000", "--train_for_seconds", "120"]
    args += ["--save_every_sec", "1000", "--max_worker_restarts", "0"]
    proc = start_train(ASYNC + args, tmp_path, "spent")
    rows = wait_for_children(exp, 4)
    wait_for_steps(exp, 60_000)
    published = _version_now(exp)
    _kill(rows, "learner")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert "what the learner left was saved as" in out
    (path,) = list_checkpoints(os.path.join(exp, "checkpoints"))
    (state,) = policy_states(load_checkpoint(path))
    assert state["version"] >= published > 0
    assert all(torch.isfinite(t).all() for t in state["model"].values() if t.is_floating_point())
    budget = env_steps_of(path) + 50_000  # the workers step on until the run stops: past 60,000, how far varies
    again = start_train(ASYNC + args[:-2] + ["--train_for_env_steps", str(budget)], tmp_path, "spent")
    out, _ = again.communicate(timeout=60)
    assert again.returncode == 0 and f"from {os.path.basename(path)}" in out, out


LAYOUT = {  # what one policy's SharedWeights needs of the shared buffers
    "param_seq": ((1,), "int64"),
    "params_wanted": ((1, 3), "int64"),
    "weights_generation": ((1,), "int64"),
    "published_copy": ((1,), "int64"),
    "run_started": ((1,), "float64"),
    "slot_owner": ((1,), "int64"),
}


def _buffers(tmp_path):
    return SharedBuffers.create(str(tmp_path / "segment"), LAYOUT)


def test_a_reader_moves_to_a_restarted_learners_weights(tmp_path):
    """The reader holds the first learner's vector; a second learner (a restart) makes its own: the reader's
    next read comes from the new one, and the weights published last are kept in the shared file."""
    buffers = _buffers(tmp_path)
    channels = {("policy_worker", 0): LocalChannel()}
    first = SharedWeights(buffers, channels)
    first.create(torch.ones(4), 3, ("policy_worker",))
    reader, local = SharedWeights(buffers, channels), torch.zeros(4)
    assert reader.connect("policy_worker", 0) and reader.read_into(local) == 3 and local.sum() == 4
    first.publish(torch.full((4,), 2.0), 4)
    version, flat = SharedWeights(buffers, channels).last_published(4)
    assert version == 4 and np.array_equal(flat, np.full(4, 2.0, np.float32))
    SharedWeights(buffers, channels).retire()  # the supervisor, once the first learner died
    assert reader.read_into(local) is None and local.sum() == 4  # its dead vector is not read: the copy stays
    second = SharedWeights(buffers, channels)  # the restarted learner, from the weights it found
    second.create(torch.from_numpy(flat) + 1, version, ("policy_worker",))
    assert reader.read_into(local) == 4  # read_into itself moves to the newer vector
    assert local.tolist() == [3.0] * 4  # the new vector, not the dead learner's
    buffers.release()


def test_weights_torn_by_a_learner_that_died_mid_publish_are_not_used(tmp_path):
    buffers = _buffers(tmp_path)
    weights = SharedWeights(buffers, {})
    assert weights.last_published(4) is None  # nothing published yet
    weights.create(torch.ones(4), 1, ())
    assert weights.last_published(4)[0] == 1
    buffers.param_seq[0] = 2 * 2 + 1  # died between the two halves of a publish
    assert weights.last_published(4) is None
    buffers.param_seq[0] = 2 * 2  # a version whose copy was not made (no room for it): not trusted
    assert weights.last_published(4) is None
    buffers.release()
    assert os.listdir(tmp_path) == []  # the segment and the file of the published weights


def test_the_slots_a_learner_takes_are_marked_for_the_supervisor_to_free(tmp_path):
    """A learner that dies holding slots leaves them marked LEARNING: the supervisor frees and books them."""
    from sf_engine.runtime.shared_buffers import LEARNING, NO_OWNER
    from sf_engine.runtime.slot_pool import SlotPool
    from sf_engine.runtime.wiring import make_queues

    layout = {"slot_owner": ((4,), "int64"), "slot_rows": ((4,), "int64"), "log_probs": ((4, 2, 3), "float32")}
    buffers = SharedBuffers.create(str(tmp_path / "segment"), layout)
    pool = SlotPool(buffers, make_queues(1, None, None, 1))
    for slot in (0, 1, 2):
        pool.hand_over(slot)
    buffers.slot_rows[:3] = 2
    assert pool.take_full(2, 0.0) == [0, 1]
    assert pool.owned_by([LEARNING]) == [0, 1] and buffers.slot_owner[2] == NO_OWNER
    assert pool.recycle(pool.owned_by([LEARNING])) == 2 * 2 * 3  # rows x envs per split, booked as dropped
    assert pool.owned_by([LEARNING]) == [] and pool.take_full(4, 0.0) == [2]
    buffers.release()
