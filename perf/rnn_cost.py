"""What a recurrent core costs: training env steps/s on CartPole-v1, feed-forward vs --rnn gru and
--rnn lstm, each with the defaults otherwise.

  python perf/rnn_cost.py --seconds 30 --rounds 3
Each round runs the three back to back (median of 2-s windows per run); the rounds interleave them,
so a slow spell of the machine touches all three. Prints each run as it ends (stderr) and one JSON
line last: per kind the median over the rounds, the ratios feed-forward / recurrent of those
medians, and the ratio of every round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import median_windows, run_train  # noqa: E402

KINDS = ("none", "gru", "lstm")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seconds", type=float, default=30.0, help="Training time of each run.")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds of the three runs (>= 1).")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1 (got {args.rounds})")
    speeds = {rnn: [] for rnn in KINDS}
    out = {"bench": "rnn_cost", "env": args.env, "seconds": args.seconds, "rounds": args.rounds}
    for round_index in range(args.rounds):
        for rnn in KINDS:
            summary = run_train(
                [
                    "--env",
                    args.env,
                    "--rnn",
                    rnn,
                    "--train_for_seconds",
                    str(args.seconds),
                    "--train_for_env_steps",
                    str(10**12),
                ],
                args.seconds + 180,
            )
            speeds[rnn].append(round(median_windows([summary])))
            out[f"{rnn}_workers_x_envs"] = f"{summary['num_workers']}x{summary['num_envs_per_worker']}"
            print(
                f"round {round_index + 1} --rnn {rnn}: {speeds[rnn][-1]:,} env steps/s, bottleneck "
                f"{summary['bottleneck']}",
                file=sys.stderr,
                flush=True,
            )
    for rnn in KINDS:
        out[f"{rnn}_env_steps_per_sec"] = round(statistics.median(speeds[rnn]))
        out[f"{rnn}_env_steps_per_sec_rounds"] = speeds[rnn]
    for rnn in KINDS[1:]:
        out[f"cost_{rnn}"] = round(out["none_env_steps_per_sec"] / out[f"{rnn}_env_steps_per_sec"], 2)
        out[f"cost_{rnn}_rounds"] = [round(a / b, 2) for a, b in zip(speeds["none"], speeds[rnn])]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
