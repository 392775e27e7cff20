"""Total training throughput with several policies against one, same flags, back to back.

  python perf/policies_throughput.py --env CartPole-v1 --policies 1,4 --seconds 60 --repeats 2
Each point is a train.py run of --seconds (median of its 2-s windows after warm-up, repeats pooled),
started with the same flags but --num_policies; the sizes are resolved once, by the first run's auto
sizing, and given to every run so that only the number of policies differs. Prints one JSON line:
per policy count its env steps/s, and each count's ratio to the first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import median_windows, run_train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--policies", default="1,4", help="comma-separated --num_policies values")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of each run")
    parser.add_argument("--repeats", type=int, default=1, help="runs per policy count, interleaved")
    parser.add_argument("--flags", default="", help="more train.py flags for every run, as one string")
    args = parser.parse_args()
    counts = [int(x) for x in args.policies.split(",")]
    flags = ["--env", args.env, "--train_for_seconds", str(args.seconds), "--train_for_env_steps", str(10**12)]
    flags += args.flags.split()
    runs: dict = {count: [] for count in counts}
    sizes: list = []
    for _ in range(args.repeats):
        for count in counts:
            summary = run_train(flags + sizes + ["--num_policies", str(count)], timeout_sec=args.seconds + 300)
            if not sizes:  # every later run gets the first one's sampler sizes
                sizes = [
                    "--num_workers",
                    str(summary["num_workers"]),
                    "--num_envs_per_worker",
                    str(summary["num_envs_per_worker"]),
                    "--rollout",
                    str(summary["rollout"]),
                ]
            runs[count].append(summary)
    rates = {count: median_windows(summaries) for count, summaries in runs.items()}
    print(
        json.dumps(
            {
                "env": args.env,
                "seconds": args.seconds,
                "repeats": args.repeats,
                "sizes": sizes,
                "env_steps_per_sec": {str(c): round(r, 1) for c, r in rates.items()},
                "ratio_to_first": {str(c): round(r / rates[counts[0]], 3) for c, r in rates.items()},
                "bottleneck": {str(c): [s["bottleneck"] for s in runs[c]] for c in counts},
                "best_return": {
                    str(c): [max((p["episode_return_mean"] or 0) for p in (s["policies"] or [s])) for s in runs[c]]
                    for c in counts
                },
            }
        )
    )


if __name__ == "__main__":
    main()
