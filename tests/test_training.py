"""End to end: serial mode learns, async mode writes every artefact and resumes, sync mode has lag 0."""

import glob
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, read_json, run_train
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from sf_engine.run.plan import build_plan
from sf_engine.run.runner import run
from sf_engine.runtime.device import cpu_has_native_bf16

pytestmark = pytest.mark.e2e

SMALL = ["--num_workers", "2", "--num_envs_per_worker", "64", "--batch_size", "1024"]


@pytest.mark.parametrize("precision", [[], ["--bf16"]], ids=["float32", "bf16"])
def test_serial_mode_learns_cartpole(tmp_path, shm_dir, precision):
    if precision and not cpu_has_native_bf16():
        pytest.skip("--bf16 needs a CPU with native bfloat16 (avx512_bf16 or AMX)")
    plan = build_plan(
        [
            "--train_dir",
            str(tmp_path),
            "--experiment",
            "serial",
            "--mode",
            "serial",
            "--shm_dir",
            shm_dir,
            "--num_workers",
            "1",
            "--num_envs_per_worker",
            "64",
            "--batch_size",
            "1024",
            "--train_for_env_steps",
            "150000",
        ]
        + precision
    )
    assert plan.cfg.run.bf16 == bool(precision)
    assert run(plan) == 0
    summary = read_json(tmp_path / "serial" / "summary.json")
    assert summary["env_steps"] >= 150_000
    assert summary["episode_return_mean"] > 100, summary  # a random policy averages about 22
    assert os.listdir(shm_dir) == []


def test_async_run_writes_stats_checkpoint_and_resumes(tmp_path, shm_dir):
    args = ["--experiment", "async", "--shm_dir", shm_dir, "--train_for_env_steps", "200000"] + SMALL
    first = run_train(args, tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    exp = tmp_path / "async"
    summary = read_json(exp / "summary.json")
    for key in (
        "env",
        "env_steps",
        "frames",
        "wall_sec",
        "env_steps_per_sec",
        "frames_per_sec",
        "episode_return_mean",
        "episodes",
        "policy_lag_mean",
        "policy_lag_max",
        "learner_version",
    ):
        assert summary[key] is not None, key
    assert summary["env_steps"] >= 200_000 and summary["learner_version"] > 0
    # per-stage time accounting covers each role's wall time (within 10%)
    assert set(summary["role_wall_seconds"]) == {"learner", "policy_worker", "rollout_worker_0", "rollout_worker_1"}
    for role, wall in summary["role_wall_seconds"].items():
        assert abs(sum(summary["stage_seconds"][role].values()) - wall) <= 0.1 * wall, (role, summary["stage_seconds"])
    assert summary["bottleneck"] in ("learning", "inference", "sampling", "balanced")
    assert summary["policy_lag_max"] >= 0
    assert read_json(exp / "config.json")["env"]["env"] == "CartPole-v1"
    assert {r["role"] for r in read_json(exp / "processes.json")["processes"]} == {"runner"}
    assert os.path.getsize(exp / "train.log") > 0
    checkpoints = glob.glob(str(exp / "checkpoints" / "checkpoint_*.pt"))
    assert len(checkpoints) == 1
    events = EventAccumulator(str(exp))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for tag in (
        "perf/frames_per_sec_10s",
        "perf/env_steps_per_sec_60s",
        "perf/learner_samples_per_sec",
        "policy_lag/mean",
        "policy_lag/max",
        "episode/return",
        "train/policy_loss",
        "train/value_loss",
        "train/entropy",
        "train/approx_kl",
        "train/clip_fraction",
        "train/grad_norm",
        "train/learning_rate",
        "train/samples_dropped_lag",
    ):
        assert tag in tags, tag
    assert os.listdir(shm_dir) == []

    replay = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "enjoy.py"),
            "--train_dir",
            str(tmp_path),
            "--experiment",
            "async",
            "--num_episodes",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert replay.returncode == 0, replay.stderr
    assert len(re.findall(r"^episode \d+: return [0-9.]+, length \d+$", replay.stdout, re.M)) == 3
    assert re.search(r"^3 episodes of CartPole-v1 .*: return [0-9.]+ \+- [0-9.]+, length [0-9.]+$", replay.stdout, re.M)

    # 100,000 env steps more: the budget is checked every quarter second, and at 150,000 env steps a second (2 cores)
    # the first run may pass 200,000 by tens of thousands
    longer = summary["env_steps"] + 100_000
    second = run_train(
        ["--experiment", "async", "--shm_dir", shm_dir, "--train_for_env_steps", str(longer)] + SMALL, tmp_path
    )
    assert second.returncode == 0, second.stdout + second.stderr
    resumed = read_json(exp / "summary.json")
    assert resumed["env_steps"] >= longer and "resuming experiment async" in second.stdout
    assert resumed["env_steps"] - summary["env_steps"] < 200_000  # continued, not started over
    assert resumed["learner_version"] > summary["learner_version"]


def test_sync_mode_has_zero_policy_lag(tmp_path, shm_dir):
    result = run_train(
        ["--experiment", "sync", "--mode", "sync", "--shm_dir", shm_dir, "--train_for_env_steps", "100000"] + SMALL,
        tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_json(tmp_path / "sync" / "summary.json")
    assert summary["learner_version"] > 5
    assert summary["policy_lag_mean"] == 0 and summary["policy_lag_max"] == 0


@pytest.mark.parametrize("vtrace", ["false", "true"])
def test_async_learns_with_gae_and_vtrace(tmp_path, shm_dir, vtrace):
    result = run_train(
        [
            "--experiment",
            "learn",
            "--with_vtrace",
            vtrace,
            "--shm_dir",
            shm_dir,
            "--stop_at_return",
            "300",
            "--train_for_env_steps",
            "3000000",
        ],
        tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_json(tmp_path / "learn" / "summary.json")
    assert summary["episode_return_mean"] >= 300, summary
