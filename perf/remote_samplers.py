"""Sampler nodes inside a run, measured on a Ray cluster of two nodes started on this machine (needs the
`[ray]` extra):

  python perf/remote_samplers.py
1. learn: `train.py --ray_address CLUSTER --num_remote_samplers 2 --num_workers 0 --stop_at_return 475`
   on CartPole-v1: the seconds from launch to the exit (start-up, Ray connection and actor start
   included) and from the run's start to the stop, the return, lag, and each actor's node and share.
2. receive: the same with --sampling_only for --seconds: the env steps/s that went through the one
   receiver into local slots (the learner hands them straight back), with its busy share.
3. kill: a --seconds run whose sampler actor 0 is killed (SIGKILL) once it has sent slots: how long
   until its successor's first slot arrived, what it dropped, whether the env-step books balance, and
   the env steps/s of the run before and after the kill.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from perf.common import REPO, median_windows, run_train  # noqa: E402
from sf_engine.stats.stages import ReceiverStage  # noqa: E402


def _read(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _kill_run(address: str, seconds: float) -> dict:
    """A run whose actor 0 is killed once it has placed slots for a few seconds."""
    with tempfile.TemporaryDirectory(prefix="sf_engine_perf_") as train_dir:
        path = os.path.join(train_dir, "kill", "summary.json")
        cmd = [
            sys.executable,
            os.path.join(REPO, "train.py"),
            "--train_dir",
            train_dir,
            "--experiment",
            "kill",
            "--ray_address",
            address,
            "--num_remote_samplers",
            "2",
            "--num_workers",
            "0",
            "--train_for_seconds",
            str(seconds),
            "--train_for_env_steps",
            str(10**12),
            "--status_every_sec",
            "1",
        ]
        process = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline, before = time.monotonic() + 120, None
        while time.monotonic() < deadline and process.poll() is None:
            before = _read(path)
            if before and before["remote_samplers"] and before["wall_sec"] > seconds / 3:
                break
            time.sleep(0.5)
        victim = before["remote_samplers"][0]
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = before["wall_sec"]
        _, err = process.communicate(timeout=seconds + 120)
        if process.returncode != 0:
            raise SystemExit(f"the kill run failed:\n{err[-3000:]}")
        after = _read(path)
    node = after["remote_samplers"][0]
    steps_after = after["env_steps"] - before["env_steps"]
    return {
        "killed_at_sec": killed_at,
        "restarts": node["restarts"],
        "recovery_sec": node["recovery_sec"],
        "dropped_env_steps": node["dropped"],
        "env_step_books": after["env_step_books"],
        "env_steps_per_sec_before_kill": before["env_steps_per_sec"],
        "env_steps_per_sec_after_kill": round(steps_after / max(after["wall_sec"] - killed_at, 1e-9), 1),
        "episode_return_mean": after["episode_return_mean"],
        "policy_lag_mean": after["policy_lag_mean"],
    }


def _actors(summary: dict) -> list:
    return [
        {
            k: node[k]
            for k in (
                "node",
                "stepped",
                "placed",
                "dropped",
                "lag_mean",
                "lag_max",
                "fetch_sec",
                "write_sec",
                "sample_sec",
            )
        }
        for node in summary["remote_samplers"]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the receive and kill runs")
    parser.add_argument("--cpus_per_node", type=int, default=1)
    args = parser.parse_args()
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": args.cpus_per_node, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=args.cpus_per_node)
        remote = ["--ray_address", cluster.address, "--num_remote_samplers", "2", "--num_workers", "0"]
        learn = run_train(remote + ["--stop_at_return", "475", "--train_for_seconds", "120"], 300)
        receive = run_train(remote + ["--sampling_only", "--train_for_seconds", str(args.seconds)], 300)
        kill = _kill_run(cluster.address, args.seconds)
    finally:
        cluster.shutdown()
    receiver = receive["stage_seconds"].get("receiver", {})
    busy = 1 - receiver.get(ReceiverStage.WAIT_REMOTE, 0.0) / max(
        receive["role_wall_seconds"].get("receiver", 1e-9), 1e-9
    )
    print(
        json.dumps(
            {
                "env": "CartPole-v1",
                "mode": "async",
                "num_workers": 0,
                "num_remote_samplers": 2,
                "nodes": 2,
                "num_envs_per_worker": learn["num_envs_per_worker"],
                "learn": {
                    "launch_to_exit_sec": learn["launch_to_exit_sec"],
                    "wall_sec": learn["wall_sec"],
                    "episode_return_mean": learn["episode_return_mean"],
                    "env_steps": learn["env_steps"],
                    "env_steps_per_sec": learn["env_steps_per_sec"],
                    "policy_lag_mean": learn["policy_lag_mean"],
                    "policy_lag_max": learn["policy_lag_max"],
                    "actors": _actors(learn),
                    "weights": learn["remote_weights"],
                    "unaccounted": learn["env_step_books"]["unaccounted"],
                },
                "receive": {
                    "env_steps_per_sec": receive["env_steps_per_sec"],
                    "env_steps_per_sec_windows_median": median_windows([receive]),
                    "receiver_busy": round(busy, 3),
                    "receiver_stage_sec": receiver,
                    "actors": _actors(receive),
                    "unaccounted": receive["env_step_books"]["unaccounted"],
                },
                "kill": kill,
                "env_steps_per_sec": receive["env_steps_per_sec"],
                "frames_per_sec": receive["frames_per_sec"],
                "policy_lag_mean": learn["policy_lag_mean"],
                "wall_sec": learn["wall_sec"],
                "episode_return_mean": learn["episode_return_mean"],
            }
        )
    )


if __name__ == "__main__":
    main()
