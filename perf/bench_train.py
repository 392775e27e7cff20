"""Training throughput and time to solve, start-up included (as `time python train.py ...` sees it).

  python perf/bench_train.py                       # CartPole-v1 defaults, until mean return >= 475
  python perf/bench_train.py --repeat 3 -- --num_workers 1
Flags after the known ones go to train.py unchanged. Prints one JSON line (medians over --repeat).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import run_train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--stop_at_return", type=float, default=475.0)
    parser.add_argument("--seconds", type=float, default=60.0, help="time budget of each run")
    parser.add_argument("--repeat", type=int, default=1)
    args, extra = parser.parse_known_args()
    extra = [x for x in extra if x != "--"]
    flags = [
        "--env",
        args.env,
        "--stop_at_return",
        str(args.stop_at_return),
        "--train_for_seconds",
        str(args.seconds),
        "--restart",
        "true",
    ] + extra
    runs = [run_train(flags, timeout_sec=args.seconds + 120) for _ in range(args.repeat)]
    solved = [
        r["launch_to_exit_sec"]
        for r in runs
        if r["episode_return_mean"] is not None and r["episode_return_mean"] >= args.stop_at_return
    ]
    median = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
    print(
        json.dumps(
            {
                "bench": "training",
                "env": args.env,
                "mode": runs[0]["mode"],
                "num_workers": runs[0]["num_workers"],
                "num_envs_per_worker": runs[0]["num_envs_per_worker"],
                "repeat": args.repeat,
                "env_steps_per_sec": round(median("env_steps_per_sec")),
                "frames_per_sec": round(median("frames_per_sec")),
                "policy_lag_mean": median("policy_lag_mean"),
                "episode_return_mean": median("episode_return_mean"),
                "wall_sec": median("launch_to_exit_sec"),
                "solved_runs": len(solved),
                "solve_sec_from_launch": sorted(solved),
                "env_steps": median("env_steps"),
                "extra_flags": extra,
            }
        )
    )


if __name__ == "__main__":
    main()
