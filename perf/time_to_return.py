"""Seconds from launch to the first greedy evaluation at or above a return, for any algorithm and env (CartPole's
value-based figures have their own script with a baseline: perf/value_cartpole.py).

  python perf/time_to_return.py --algo crossq --env Pendulum-v1 --threshold -250 --limit_sec 120 --rounds 2
  python perf/time_to_return.py --algo sac --env Pendulum-v1 --threshold -250 -- --learning_starts 1000

Each round: train.py --algo ALGO --env ENV --seed ROUND --train_for_seconds LIMIT --eval_every_sec 5
--eval_episodes 10 --stop_at_eval_return THRESHOLD (more flags after --); the time of the first evaluation line at or
above the threshold from the launch of train.py (imports and start-up included: the user's wait), None where no
evaluation reached it within the limit, and every evaluation [seconds, return]. Prints each run (stderr) and one JSON
line last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import EVAL_LINE, REPO  # noqa: E402


def run_once(algo: str, env: str, threshold: float, limit_sec: float, seed: int, extra: list) -> dict:
    with tempfile.TemporaryDirectory(prefix="sf_engine_perf_") as train_dir:
        cmd = [sys.executable, os.path.join(REPO, "train.py"), "--train_dir", train_dir, "--experiment", "perf"]
        cmd += ["--algo", algo, "--env", env, "--seed", str(seed), "--train_for_seconds", str(limit_sec)]
        cmd += ["--eval_every_sec", "5", "--eval_episodes", "10", "--stop_at_eval_return", str(threshold), *extra]
        start, evaluations, reached = time.monotonic(), [], None
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            found = EVAL_LINE.search(line)
            if found:
                seconds, value = round(time.monotonic() - start, 1), float(found.group(2))
                evaluations.append([seconds, value])
                if value >= threshold and reached is None:
                    reached = seconds
        if proc.wait():
            raise SystemExit(f"train.py --algo {algo} exited with {proc.returncode}")
        with open(os.path.join(train_dir, "perf", "summary.json")) as f:
            summary = json.load(f)
    return {"seconds_to_threshold": reached, "evaluations": evaluations, "env_steps": summary["env_steps"], **summary}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--algo", required=True)
    parser.add_argument("--env", required=True)
    parser.add_argument("--threshold", type=float, required=True, help="the greedy evaluation's return to reach")
    parser.add_argument("--limit_sec", type=float, default=120.0, help="each run's --train_for_seconds")
    parser.add_argument("--rounds", type=int, default=1, help="runs, round i with --seed i")
    parser.add_argument("train_args", nargs="*", help="more flags for train.py (after --)")
    args = parser.parse_args()
    runs = []
    for seed in range(args.rounds):
        runs.append(run_once(args.algo, args.env, args.threshold, args.limit_sec, seed, args.train_args))
        print(f"seed {seed}:", json.dumps({k: runs[-1][k] for k in ("seconds_to_threshold", "evaluations")}),
              file=sys.stderr, flush=True)  # fmt: skip
    times = [run["seconds_to_threshold"] for run in runs]
    last = runs[-1]
    print(
        json.dumps(
            {
                "bench": "time_to_return",
                "env": args.env,
                "algo": args.algo,
                "mode": last["mode"],
                "threshold": args.threshold,
                "seconds_to_threshold": times,
                "seconds_to_threshold_median": statistics.median(times) if None not in times else None,
                "best_eval": [max((v for _, v in run["evaluations"]), default=None) for run in runs],
                "num_workers": last["num_workers"],
                "num_envs_per_worker": last["num_envs_per_worker"],
                "env_steps_per_sec": statistics.median(run["env_steps_per_sec"] for run in runs),
                "frames_per_sec": statistics.median(run["frames_per_sec"] for run in runs),
                "policy_lag_mean": last["policy_lag_mean"],
                "wall_sec": sum(run["wall_sec"] for run in runs),
                "episode_return_mean": last["episode_return_mean"],
            }
        )
    )


if __name__ == "__main__":
    main()
