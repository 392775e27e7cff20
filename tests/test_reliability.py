"""Reliability: failed workers are restarted, stops are clean, nothing is left behind, checkpoints are
checked."""

import errno
import glob
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import REPO, one_line_error, read_json, run_train

TESTS = os.path.dirname(os.path.abspath(__file__))
ASYNC = ["--num_workers", "2", "--num_envs_per_worker", "16", "--batch_size", "512", "--rollout", "32"]


def _as_from_a_terminal():
    """The child gets Ctrl-C as in a terminal, even where the tests run with SIGINT ignored (a
    background job of a non-interactive shell inherits SIG_IGN, and Python then keeps it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


STARTED = []


def start_train(args, train_dir, experiment, **env):
    cmd = [
        sys.executable,
        os.path.join(REPO, "train.py"),
        "--train_dir",
        str(train_dir),
        "--experiment",
        experiment,
        "--status_every_sec",
        "1",
    ] + list(args)
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_as_from_a_terminal,
        env={**os.environ, "PYTHONPATH": TESTS, **env},
    )
    STARTED.append(proc)
    return proc


@pytest.fixture(autouse=True)
def no_leftover_runs():
    """A failed test must not leave its run training in the background."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_for_children(exp_dir, count, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = os.path.join(exp_dir, "processes.json")
        if os.path.exists(path):
            rows = [r for r in read_json(path)["processes"] if r["role"] != "runner"]
            if len(rows) >= count:
                return rows
        time.sleep(0.3)
    raise AssertionError(f"{count} children never started")


def wait_for_steps(exp_dir, more_than, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = os.path.join(exp_dir, "summary.json")
        if os.path.exists(path) and read_json(path)["env_steps"] > more_than:
            return read_json(path)["env_steps"]
        time.sleep(0.5)
    raise AssertionError(f"env steps never passed {more_than}")


def alive(pids):
    alive_pids = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive_pids.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive_pids


def books_balance(summary):
    books = summary["env_step_books"]
    assert books["unaccounted"] == 0, books
    return books


def wait_for(exp_dir, key, value, timeout=60):
    """Until summary.json's `key` reaches `value`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = os.path.join(exp_dir, "summary.json")
        if os.path.exists(path) and read_json(path)[key] >= value:
            return
        time.sleep(0.3)
    raise AssertionError(f"{key} never reached {value}")


@pytest.mark.e2e
def test_killed_workers_are_restarted_and_training_goes_on(tmp_path, shm_dir):
    """A rollout worker, then the policy worker (which restarts the rollout workers too), killed with
    SIGKILL in one run: each is restarted, and the run ends on its env-step budget, so only by
    sampling and training on after the kills."""
    exp = str(tmp_path / "kill")
    proc = start_train(
        ASYNC
        + [
            "--shm_dir",
            shm_dir,
            "--train_for_env_steps",  # beyond what a fast machine samples while the kills and restarts take place
            "1000000",
            "--train_for_seconds",
            "90",
            "--save_every_sec",
            "5",
        ],
        tmp_path,
        "kill",
    )
    rows = wait_for_children(exp, 4)
    wait_for_steps(exp, 30_000)
    os.kill(next(r["pid"] for r in rows if r["role"] == "rollout_worker" and r["index"] == 0), signal.SIGKILL)
    wait_for(exp, "worker_restarts", 1)
    os.kill(next(r["pid"] for r in rows if r["role"] == "policy_worker"), signal.SIGKILL)
    wait_for(exp, "policy_worker_restarts", 1)
    after_kills = read_json(os.path.join(exp, "summary.json"))["env_steps"]
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, out
    summary = read_json(os.path.join(exp, "summary.json"))
    assert (summary["worker_restarts"], summary["policy_worker_restarts"]) == (1, 1), out
    assert out.count("killed by SIGKILL") == 2 and "env-step budget reached" in out
    assert summary["env_steps"] > after_kills + 50_000  # sampling and training went on
    assert summary["learner_version"] > 10
    books_balance(summary)
    assert os.listdir(shm_dir) == []


@pytest.mark.e2e
@pytest.mark.parametrize(
    "env_id, extra, words",
    [
        (
            "toy_envs:RaiseOnceEnv",
            ["--train_for_env_steps", "20000"],
            ["RuntimeError: simulated env failure on step 100", "died (exit code 1)"],
        ),
        # the other worker samples on while the stuck one waits out its timeout: a budget well beyond that (the two
        # workers sample about 80,000 env steps/s on 2 cores)
        (
            "toy_envs:HangOnceEnv",
            ["--stuck_timeout_sec", "3", "--train_for_env_steps", "1000000"],
            ["stuck (no heartbeat for"],
        ),
    ],
)
def test_a_failing_or_hanging_env_gets_its_worker_restarted(tmp_path, shm_dir, env_id, extra, words):
    proc = start_train(
        ASYNC + ["--env", env_id, "--shm_dir", shm_dir, "--train_for_seconds", "90"] + extra,
        tmp_path,
        "fault",
        SF_TEST_FAULT_MARKER=str(tmp_path / "fault_marker"),
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "env-step budget reached" in out  # ended by training on after the restart, not by the clock
    for word in words:
        assert word in out, out
    assert f"on env {env_id}" in out
    assert out.count("Traceback") <= 1  # logged once, by the runner
    summary = read_json(tmp_path / "fault" / "summary.json")
    assert summary["worker_restarts"] == 1
    assert summary["learner_version"] >= 5  # training went on after the restart
    books_balance(summary)
    assert os.listdir(shm_dir) == []


@pytest.mark.e2e
def test_repeated_worker_failures_stop_the_run_cleanly(tmp_path, shm_dir):
    # without the marker variable every env fails on its 100th step
    result = run_train(
        ASYNC
        + [
            "--env",
            "toy_envs:RaiseOnceEnv",
            "--shm_dir",
            shm_dir,
            "--max_worker_restarts",
            "2",
            "--experiment",
            "broken",
        ],
        tmp_path,
        timeout=120,
        env={**os.environ, "PYTHONPATH": TESTS},
    )
    assert result.returncode == 1, result.stdout
    assert "3 process failures within" in result.stdout and "--max_worker_restarts" in result.stdout
    assert glob.glob(str(tmp_path / "broken" / "checkpoints" / "checkpoint_*.pt"))
    assert os.listdir(shm_dir) == []


@pytest.mark.e2e
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_sigint_and_sigterm_stop_cleanly_within_10_s(tmp_path, shm_dir, sig, code):
    exp = str(tmp_path / "stop")
    proc = start_train(ASYNC + ["--shm_dir", shm_dir, "--train_for_seconds", "300"], tmp_path, "stop")
    children = [r["pid"] for r in wait_for_children(exp, 4)]
    wait_for_steps(exp, 0)
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)  # what a terminal does on Ctrl-C: the whole process group
    else:
        proc.send_signal(sig)  # what a scheduler or `kill` does: the runner only
    start = time.monotonic()
    out, _ = proc.communicate(timeout=30)
    assert time.monotonic() - start < 10.0, out
    assert proc.returncode == code, out
    assert not alive(children)
    assert os.listdir(shm_dir) == []
    from sf_engine.runtime.checkpoint import latest_checkpoint, load_checkpoint

    state = load_checkpoint(latest_checkpoint(os.path.join(exp, "checkpoints")))
    assert state["env_steps"] > 0 and "model" in state
    books_balance(read_json(os.path.join(exp, "summary.json")))


@pytest.mark.e2e
def test_after_sigkill_of_the_runner_children_exit_and_the_next_start_cleans_up(tmp_path, shm_dir):
    exp = str(tmp_path / "crash")
    args = ASYNC + ["--shm_dir", shm_dir, "--save_every_sec", "2"]
    proc = start_train(args + ["--train_for_seconds", "300"], tmp_path, "crash")
    children = [r["pid"] for r in wait_for_children(exp, 4)]
    deadline = time.monotonic() + 60
    while not glob.glob(os.path.join(exp, "checkpoints", "checkpoint_*.pt")) and time.monotonic() < deadline:
        time.sleep(0.5)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while alive(children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(children)
    left = sorted(os.listdir(shm_dir))  # the dead runner could not remove its segment and the files beside it:
    segment = left[0]  # its last published weights, the learner's kept training state (and one being written)
    assert {segment + side for side in ("", ".weights", ".training")} <= set(left), left
    assert set(left) <= {segment + side for side in ("", ".weights", ".training", ".training.tmp")}, left
    from sf_engine.runtime.checkpoint import env_steps_of, latest_checkpoint

    resumed_at = env_steps_of(latest_checkpoint(os.path.join(exp, "checkpoints")))
    result = run_train(args + ["--experiment", "crash", "--train_for_env_steps", str(resumed_at + 50_000)], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "resuming experiment crash" in result.stdout
    assert os.listdir(shm_dir) == []


@pytest.mark.e2e
def test_a_corrupted_newest_checkpoint_is_reported_and_the_previous_one_used(tmp_path, shm_dir, capsys):
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    base = [
        "--experiment",
        "corrupt",
        "--mode",
        "serial",
        "--shm_dir",
        shm_dir,
        "--num_workers",
        "1",
        "--num_envs_per_worker",
        "8",
        "--batch_size",
        "256",
        "--train_dir",
        str(tmp_path),
    ]
    assert run(build_plan(base + ["--train_for_env_steps", "3000"])) == 0
    assert run(build_plan(base + ["--train_for_env_steps", "6000"])) == 0
    paths = sorted(glob.glob(str(tmp_path / "corrupt" / "checkpoints" / "checkpoint_*.pt")))
    assert len(paths) == 2
    data = bytearray(open(paths[-1], "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(paths[-1], "wb").write(bytes(data))
    capsys.readouterr()
    assert run(build_plan(base + ["--train_for_env_steps", "9000"])) == 0
    out = capsys.readouterr().out
    assert f"{paths[-1]} is truncated or corrupted (checksum mismatch): using the checkpoint before it" in out
    assert f"from {os.path.basename(paths[0])}" in out


def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    from sf_engine.runtime import checkpoint

    path = str(tmp_path / "checkpoint.pt")
    checkpoint.save_state_atomic(path, {"version": 1})

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.os, "fsync", disk_full)
    with pytest.raises(OSError):
        checkpoint.save_state_atomic(path, {"version": 2})
    assert checkpoint.load_checkpoint(path) == {"version": 1}
    assert os.listdir(tmp_path) == ["checkpoint.pt"]  # no temporary file left


def test_the_learner_goes_on_when_a_checkpoint_cannot_be_written(tmp_path, monkeypatch):
    from conftest import SerialRun

    from sf_engine.roles import learner as learner_module
    from sf_engine.run.plan import build_plan
    from sf_engine.stats.messages import CheckpointFailed

    plan = build_plan(
        [
            "--mode",
            "serial",
            "--num_workers",
            "1",
            "--num_envs_per_worker",
            "8",
            "--batch_size",
            "256",
            "--train_dir",
            str(tmp_path),
        ]
    )
    run = SerialRun(plan, tmp_path)
    learner = run.learner
    first = learner.save()

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(learner_module, "save_checkpoint", disk_full)
    learner.version += 1
    assert learner.save() is None
    assert os.listdir(plan.paths.checkpoint_dir) == [os.path.basename(first)]
    assert run.messages(CheckpointFailed)
    run.close()


@pytest.mark.e2e
def test_not_enough_memory_is_one_line_with_the_fix(tmp_path, shm_dir):
    # 100,000 workers: more memory than any host has, whatever this one has
    line = one_line_error(
        run_train(
            ["--shm_dir", shm_dir, "--num_workers", "100000", "--num_envs_per_worker", "8", "--batch_size", "256"],
            tmp_path,
        )
    )
    assert "MiB of memory" in line and "--num_workers" in line


class _RunsCode:
    """Pickles as a call of os.system: what a checkpoint from elsewhere could carry."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_checkpoint_carrying_a_pickled_callable_is_refused_and_nothing_runs(tmp_path, shm_dir, capsys):
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run
    from sf_engine.runtime import checkpoint

    base = [
        "--experiment",
        "foreign",
        "--mode",
        "serial",
        "--shm_dir",
        shm_dir,
        "--num_workers",
        "1",
        "--num_envs_per_worker",
        "8",
        "--batch_size",
        "256",
        "--train_dir",
        str(tmp_path),
    ]
    assert run(build_plan(base + ["--train_for_env_steps", "3000"])) == 0
    good = checkpoint.latest_checkpoint(str(tmp_path / "foreign" / "checkpoints"))
    marker = tmp_path / "code_ran"
    state = checkpoint.load_checkpoint(good)
    state["model"] = _RunsCode(marker)  # with a valid checksum: integrity is not origin
    evil = str(tmp_path / "foreign" / "checkpoints" / "checkpoint_v000000099_s0000000099999.pt")
    checkpoint.save_state_atomic(evil, state)
    with pytest.raises(checkpoint.CheckpointError, match="refused"):
        checkpoint.load_checkpoint(evil)
    capsys.readouterr()
    plan = build_plan(base + ["--train_for_env_steps", "6000"])  # resume skips it for the one before
    assert plan.resume_from == good and any("refused" in note for note in plan.notes)
    from sf_engine.play import enjoy as enjoy_script

    assert enjoy_script.main(["--train_dir", str(tmp_path), "--experiment", "foreign", "--checkpoint", evil]) == 2
    assert "refused" in capsys.readouterr().err
    assert not marker.exists()  # nothing in the file ran
