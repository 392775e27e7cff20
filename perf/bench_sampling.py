"""Sampling throughput: rollout workers + policy worker with the real policy, no learning.

  python perf/bench_sampling.py --env CartPole-v1 --seconds 20 --num_workers 2
Extra flags after the known ones go to train.py unchanged. Prints one JSON line (median of 2-s windows
after warm-up, over all --repeat runs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import median_windows, run_train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds after warm-up")
    parser.add_argument("--warmup_sec", type=float, default=5.0, help="start-up and warm-up, not measured")
    parser.add_argument("--num_workers", type=int, default=2)
    parser.add_argument("--num_envs_per_worker", type=int, default=None, help="default: train.py's")
    parser.add_argument("--repeat", type=int, default=1, help="runs; the figure is the median over all windows")
    args, extra = parser.parse_known_args()
    flags = [
        "--env",
        args.env,
        "--num_workers",
        str(args.num_workers),
        "--sampling_only",
        "true",
        "--train_for_seconds",
        str(args.seconds + args.warmup_sec),
        "--restart",
        "true",
    ] + extra
    if args.num_envs_per_worker:
        flags += ["--num_envs_per_worker", str(args.num_envs_per_worker)]
    summaries = [run_train(flags, timeout_sec=args.seconds + args.warmup_sec + 120) for _ in range(args.repeat)]
    steps_per_sec = median_windows(summaries)
    frameskip = summaries[0]["frames"] / max(summaries[0]["env_steps"], 1)
    print(
        json.dumps(
            {
                "bench": "sampling",
                "env": args.env,
                "mode": summaries[0]["mode"],
                "num_workers": args.num_workers,
                "num_envs_per_worker": summaries[0]["num_envs_per_worker"],
                "repeat": args.repeat,
                "env_steps_per_sec": round(steps_per_sec),
                "frames_per_sec": round(steps_per_sec * frameskip),
                "env_steps_per_sec_runs": [round(s["env_steps_per_sec"]) for s in summaries],
                "policy_lag_mean": summaries[0]["policy_lag_mean"],
                "wall_sec": round(statistics.mean(s["wall_sec"] for s in summaries), 1),
                "extra_flags": extra,
            }
        )
    )


if __name__ == "__main__":
    main()
