"""Faults beyond a process dying: a process paused (SIGSTOP) and resumed, two Ctrl-C in a row, a full disk
under the experiment, the wall clock jumping. Each row of docs/reliability.md's table names its test."""

import glob
import os
import signal
import subprocess
import time

import pytest
from conftest import read_json
from test_reliability import (  # noqa: F401  (no_leftover_runs: the autouse fixture that kills what a test left)
    ASYNC,
    alive,
    books_balance,
    no_leftover_runs,
    start_train,
    wait_for,
    wait_for_children,
    wait_for_steps,
)


def _pid(rows, role, index=0):
    return next(r["pid"] for r in rows if r["role"] == role and r["index"] == index)


@pytest.mark.e2e
def test_a_paused_worker_resumes_and_a_paused_learner_is_replaced(tmp_path, shm_dir):
    """SIGSTOP then SIGCONT of a rollout worker within --stuck_timeout_sec: it goes on, nothing restarted.
    A learner left paused past the timeout is stuck: killed and replaced, and training goes on."""
    exp = str(tmp_path / "pause")
    args = ["--shm_dir", shm_dir, "--stuck_timeout_sec", "4", "--train_for_env_steps", "300000"]
    proc = start_train(ASYNC + args + ["--train_for_seconds", "120"], tmp_path, "pause")
    rows = wait_for_children(exp, 4)
    wait_for_steps(exp, 30_000)
    worker = _pid(rows, "rollout_worker")
    os.kill(worker, signal.SIGSTOP)
    time.sleep(1.5)
    os.kill(worker, signal.SIGCONT)
    os.kill(_pid(rows, "learner"), signal.SIGSTOP)
    wait_for(exp, "learner_restarts", 1, timeout=30)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    summary = read_json(os.path.join(exp, "summary.json"))
    assert summary["worker_restarts"] == 0 and summary["learner_restarts"] == 1, out
    assert "learner 0 on env CartPole-v1 stuck (no heartbeat for" in out and "env-step budget reached" in out
    books_balance(summary)
    assert os.listdir(shm_dir) == []


@pytest.mark.e2e
def test_two_ctrl_c_in_a_row_stop_at_once_and_leave_nothing_half_written(tmp_path, shm_dir):
    exp = str(tmp_path / "twice")
    args = ASYNC + ["--shm_dir", shm_dir, "--save_every_sec", "1", "--train_for_seconds", "300"]
    proc = start_train(args, tmp_path, "twice")
    children = [r["pid"] for r in wait_for_children(exp, 4)]
    wait_for_steps(exp, 30_000)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    start = time.monotonic()
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130 and time.monotonic() - start < 8.0, out
    assert not alive(children) and os.listdir(shm_dir) == []
    assert not glob.glob(os.path.join(exp, "**", "*.tmp"), recursive=True)
    again = start_train(ASYNC + ["--shm_dir", shm_dir, "--train_for_seconds", "3"], tmp_path, "twice")
    out, _ = again.communicate(timeout=60)
    assert again.returncode == 0 and "resuming experiment twice from checkpoint_" in out, out


def _small_filesystem(path, megabytes, options="") -> bool:
    """A tmpfs of `megabytes` at `path` (needs the right to mount; the test is skipped without it)."""
    os.makedirs(path)
    options = f"size={megabytes}M" + (f",{options}" if options else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", path], capture_output=True)
    return done.returncode == 0


@pytest.mark.e2e
def test_a_train_dir_on_a_read_only_filesystem_is_one_line(tmp_path):
    """Found before anything starts (even for root, whom permissions do not stop)."""
    from conftest import one_line_error, run_train

    read_only = str(tmp_path / "read_only")
    if not _small_filesystem(read_only, 1, "ro"):
        pytest.skip("mounting a small tmpfs needs privileges this machine does not give")
    try:
        line = one_line_error(run_train(["--train_for_env_steps", "1000"], os.path.join(read_only, "runs")))
        assert "--train_dir" in line and "not writable" in line, line
    finally:
        subprocess.run(["umount", "-l", read_only], capture_output=True)


@pytest.mark.e2e
def test_a_disk_that_fills_up_during_a_run_costs_checkpoints_not_the_run(tmp_path, shm_dir):
    """The experiment's filesystem fills up mid-run: checkpoints, summary.json, TensorBoard and the log
    fail to write and are reported, training goes on to its budget, nothing half-written is left, and
    once there is room again the same command resumes from the last checkpoint written."""
    train_dir = str(tmp_path / "small")
    if not _small_filesystem(train_dir, 16):
        pytest.skip("mounting a small tmpfs needs privileges this machine does not give")
    try:
        exp = os.path.join(train_dir, "full")
        args = ASYNC + ["--shm_dir", shm_dir, "--save_every_sec", "1"]
        proc = start_train(args + ["--train_for_seconds", "15"], train_dir, "full")
        wait_for_steps(exp, 30_000)
        time.sleep(1.5)  # a checkpoint written before the disk fills
        filler = os.path.join(train_dir, "filler")
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M", "count=64"], capture_output=True)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert "No space left on device" in out and "time budget reached" in out
        assert "Traceback" not in out
        assert not glob.glob(os.path.join(exp, "**", "*.tmp"), recursive=True)
        events = glob.glob(os.path.join(exp, "events.out.tfevents.*"))
        assert len(events) <= 2 and all(os.path.getsize(path) > 0 for path in events)  # no empty one per try
        os.unlink(filler)
        again = start_train(ASYNC + ["--shm_dir", shm_dir, "--train_for_seconds", "3"], train_dir, "full")
        out, _ = again.communicate(timeout=60)
        assert again.returncode == 0 and "resuming experiment full from checkpoint_" in out, out
    finally:
        subprocess.run(["umount", "-l", train_dir], capture_output=True)


def test_a_wall_clock_jump_changes_no_budget_or_timeout(tmp_path, monkeypatch):
    """Every duration is measured on the monotonic clock: the wall clock jumping two hours ahead in the
    middle of a run neither ends its time budget nor makes a process look stuck."""
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    real_time, calls = time.time, [0]

    def jumping_time():
        calls[0] += 1
        return real_time() + (7200.0 if calls[0] > 1 else 0.0)  # the first reading before the jump

    monkeypatch.setattr(time, "time", jumping_time)
    args = ["--env", "CartPole-v1", "--mode", "serial", "--num_workers", "1", "--num_envs_per_worker", "8"]
    args += ["--rollout", "16", "--batch_size", "128", "--train_for_env_steps", "20000", "--train_for_seconds", "600"]
    args += ["--train_dir", str(tmp_path), "--experiment", "clock", "--stuck_timeout_sec", "60"]
    assert run(build_plan(args)) == 0
    summary = read_json(os.path.join(tmp_path, "clock", "summary.json"))
    assert summary["env_steps"] >= 20000 and calls[0] > 2  # ended on its env-step budget, after the jump


@pytest.mark.e2e
def test_the_last_checkpoint_and_the_summary_count_the_same_env_steps(tmp_path, shm_dir):
    """The learner stops last, once nothing samples any more: its last checkpoint's name and summary.json
    give one env-step count (they used to differ by the steps sampled while the learner saved)."""
    from sf_engine.runtime.checkpoint import env_steps_of, latest_checkpoint

    exp = str(tmp_path / "count")
    proc = start_train(ASYNC + ["--shm_dir", shm_dir, "--train_for_env_steps", "60000"], tmp_path, "count")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    summary = read_json(os.path.join(exp, "summary.json"))
    assert env_steps_of(latest_checkpoint(os.path.join(exp, "checkpoints"))) == summary["env_steps"] >= 60000


@pytest.mark.e2e
def test_a_shm_dir_too_small_is_one_line_with_the_size_needed_and_the_flags(tmp_path):
    """Checked before anything starts: the size the buffers need, what the tmpfs has, the flags that shrink
    them; nothing is created in the experiment or the tmpfs."""
    from conftest import one_line_error, run_train

    small = str(tmp_path / "tmpfs")
    if not _small_filesystem(small, 1):
        pytest.skip("mounting a small tmpfs needs privileges this machine does not give")
    try:
        args = ["--shm_dir", small, "--num_workers", "2", "--num_envs_per_worker", "256", "--rollout", "32"]
        line = one_line_error(run_train(args + ["--batch_size", "16384", "--experiment", "shm"], tmp_path))
        assert "shared buffers need" in line and "MiB free" in line and "--num_envs_per_worker" in line, line
        assert os.listdir(small) == [] and not os.path.exists(tmp_path / "shm")  # the experiment
    finally:
        subprocess.run(["umount", "-l", small], capture_output=True)
