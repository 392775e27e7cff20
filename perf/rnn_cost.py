"""What a recurrent core costs: training env steps/s on CartPole-v1, feed-forward vs --rnn gru and
--rnn lstm, each with the defaults otherwise (one run each, back to back, median of 2-s windows).

  python perf/rnn_cost.py --seconds 40
Prints each run as it ends (stderr) and one JSON line last with the ratios feed-forward / recurrent.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import median_windows, run_train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seconds", type=float, default=40.0)
    args = parser.parse_args()
    out = {"bench": "rnn_cost", "env": args.env}
    for rnn in ("none", "gru", "lstm"):
        summary = run_train(["--env", args.env, "--rnn", rnn, "--train_for_seconds", str(args.seconds),
                             "--train_for_env_steps", str(10**12)], args.seconds + 180)
        out[f"{rnn}_env_steps_per_sec"] = round(median_windows([summary]))
        out[f"{rnn}_workers_x_envs"] = f"{summary['num_workers']}x{summary['num_envs_per_worker']}"
        print(f"--rnn {rnn}: {out[f'{rnn}_env_steps_per_sec']:,} env steps/s, bottleneck {summary['bottleneck']}",
              file=sys.stderr, flush=True)
    for rnn in ("gru", "lstm"):
        out[f"cost_{rnn}"] = round(out["none_env_steps_per_sec"] / out[f"{rnn}_env_steps_per_sec"], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
