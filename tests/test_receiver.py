"""Sampler nodes inside a run (--ray_address, --num_remote_samplers; sf_engine.scaleout.receiver): the flags are
checked before anything on disk changes, a run without them never imports Ray, CartPole learns from
the sampler actors of a two-node Ray cluster alone, and a killed actor is restarted by Ray while
training goes on, with the env-step books balanced and nothing left running or in shared memory."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import REPO, files_of, read_json, run_train, train_error


@pytest.mark.parametrize(
    "flags,named",
    [
        (["--num_remote_samplers", "2"], "--ray_address"),
        (["--ray_address", "local"], "--num_remote_samplers"),
        (["--ray_address", " ", "--num_remote_samplers", "1"], "--ray_address"),
        (["--ray_address", "local", "--num_remote_samplers", "-1"], "--num_remote_samplers"),
        (["--ray_address", "local", "--num_remote_samplers", "1", "--mode", "sync"], "--mode sync"),
        (["--ray_address", "local", "--num_remote_samplers", "1", "--remote_num_workers", "0"], "--remote_num_workers"),
        (
            ["--ray_address", "local", "--num_remote_samplers", "1", "--remote_cpus_per_sampler", "0"],
            "--remote_cpus_per_sampler",
        ),
        (["--ray_address", "local", "--num_remote_samplers", "2", "--num_policies", "2", "--pbt"], "--pbt"),
        (["--num_workers", "0"], "--num_workers"),
    ],
)
def test_bad_remote_flags_are_one_line_and_touch_nothing(tmp_path, capsys, flags, named):
    line = train_error(flags, tmp_path, capsys)
    assert named in line
    assert files_of(tmp_path) == {}


def test_a_run_without_ray_address_never_imports_ray(tmp_path, shm_dir):
    code = (
        "import json, sys; from sf_engine.run.runner import main; "
        f"code = main(['--mode', 'serial', '--train_for_env_steps', '3000', '--train_dir', {str(tmp_path)!r}, "
        f"'--shm_dir', {shm_dir!r}, '--num_envs_per_worker', '8']); "
        "print(json.dumps({'code': code, 'ray': 'ray' in sys.modules}))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"code": 0, "ray": False}, result.stderr[-2000:]


def test_a_lost_actor_drops_what_it_stepped_and_did_not_send():
    from sf_engine.scaleout.receiver import DROPPED, PLACED, STEPPED, Receiver, RemoteSampler, remote_books_at_stop

    receiver = Receiver.__new__(Receiver)  # the books alone: no Ray, no run
    receiver.books = np.zeros((2, 3), np.int64)
    first, second = {"host": "a", "node": "n", "pid": 1}, {"host": "a", "node": "n", "pid": 2}
    sampler = RemoteSampler(1, actor=None, calls=["open call"], identity=first, stepped=5_000, returned=4_096)
    receiver.books[1, [STEPPED, PLACED]] = 5_000, 4_096
    receiver._call_failed(sampler, "lost")
    receiver._call_failed(sampler, "lost")  # its other open call fails too
    assert sampler.calls == [] and receiver.books[1, DROPPED] == 0, "booked before knowing the actor is gone"
    receiver._heard_from(sampler, first)  # the same process answers: nothing lost
    assert receiver.books[1, DROPPED] == 0 and sampler.figures.restarts == 0
    receiver._call_failed(sampler, "lost")
    receiver._heard_from(sampler, second)  # a new process: its predecessor's unsent steps are dropped
    assert receiver.books[1, DROPPED] == 904 and sampler.figures.restarts == 1
    assert (sampler.stepped_before, sampler.stepped, sampler.returned) == (5_000, 0, 0)
    assert remote_books_at_stop(receiver.books) == (904, 0)


def _ray_processes() -> list:
    found = subprocess.run(["pgrep", "-f", "raylet|gcs_server|ray::"], capture_output=True, text=True).stdout.split()
    return [pid for pid in found if int(pid) != os.getpid()]


@pytest.mark.e2e  # starts a two-node Ray cluster on this machine and trains to a return
def test_cartpole_learns_from_sampler_actors_on_a_two_node_cluster(tmp_path, shm_dir):
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        result = run_train(
            [
                "--ray_address",
                cluster.address,
                "--num_remote_samplers",
                "2",
                "--num_workers",
                "0",
                "--train_for_seconds",
                "30",
                "--train_for_env_steps",
                str(10**10),
                "--shm_dir",
                shm_dir,
                "--experiment",
                "remote",
            ],
            tmp_path,
            timeout=300,
        )
    finally:
        cluster.shutdown()
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_json(tmp_path / "remote" / "summary.json")
    assert summary["episode_return_mean"] >= 400, summary["episode_return_mean"]
    nodes = summary["remote_samplers"]
    assert len(nodes) == 2 and len({node["node"] for node in nodes}) == 2, "the actors did not spread over both nodes"
    assert all(node["placed"] > 0 and node["lag_mean"] is not None for node in nodes)
    assert summary["num_workers"] == 0 and summary["policy_lag_mean"] is not None
    assert summary["env_step_books"]["unaccounted"] == 0
    assert sum(node["stepped"] for node in nodes) == summary["env_steps"]
    assert os.listdir(shm_dir) == []


def _wait_for(path, ready, timeout_sec: float):
    deadline = time.monotonic() + timeout_sec
    while time.monotonic() < deadline:
        try:
            data = read_json(path)
            if ready(data):
                return data
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"{path} never showed what the test waits for")


@pytest.mark.e2e  # starts a Ray instance, kills one of its actors mid-run
def test_a_killed_sampler_actor_is_restarted_and_training_goes_on(tmp_path, shm_dir):
    pytest.importorskip("ray")
    cmd = [
        sys.executable,
        os.path.join(REPO, "train.py"),
        "--train_dir",
        str(tmp_path),
        "--experiment",
        "kill",
        "--ray_address",
        "local",
        "--num_remote_samplers",
        "2",
        "--num_workers",
        "0",
        "--train_for_seconds",
        "45",
        "--train_for_env_steps",
        str(10**10),
        "--status_every_sec",
        "1",
        "--shm_dir",
        shm_dir,
    ]
    process = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        path = tmp_path / "kill" / "summary.json"
        before = _wait_for(path, lambda d: d["remote_samplers"] and d["remote_samplers"][0]["placed"] > 0, 120)
        victim = before["remote_samplers"][0]
        os.kill(victim["pid"], signal.SIGKILL)
        out, err = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err[-3000:]
    summary = read_json(path)
    node = summary["remote_samplers"][0]
    assert node["restarts"] == 1 and node["pid"] != victim["pid"], node
    assert node["recovery_sec"] is not None and node["recovery_sec"] < 30, node
    assert node["placed"] > victim["placed"], "no slot from the restarted actor"
    assert summary["env_step_books"]["unaccounted"] == 0, summary["env_step_books"]
    assert summary["env_step_books"]["dropped_lost_samplers"] == sum(n["dropped"] for n in summary["remote_samplers"])
    assert "sampler actor 0 back" in (tmp_path / "kill" / "train.log").read_text()
    assert os.listdir(shm_dir) == [], "a sampler actor's shared memory was left behind"
    assert _ray_processes() == [], "Ray processes were left running"
