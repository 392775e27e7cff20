"""Auto sizing on a loaded machine: with --busy processes spinning beside it (each a Python busy loop), training
env steps/s of `--num_workers auto` against each hand-set --num_workers, on a pure-Python Gymnasium env and on
EnvPool's CartPole, each run --seconds long; and the line auto sizing printed.

  python perf/autosize_busy.py                          # 2 busy loops, Acrobot-v1 (Gymnasium) and CartPole (EnvPool)
  python perf/autosize_busy.py --busy 0 --workers 1,2   # the same on a quiet machine

Prints each run (stderr) and one JSON line last: per env the auto choice, its env steps/s, the best hand-set
number and its env steps/s, and the ratio auto / best.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import run_train  # noqa: E402

ENVS = {
    "python": ["--env", "Acrobot-v1", "--env_backend", "gymnasium"],
    "envpool": ["--env", "CartPole-v1", "--env_backend", "envpool"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--busy", type=int, default=2, help="busy-loop processes running beside the runs")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each run")
    parser.add_argument("--workers", default="1,2,3,4", help="the hand-set --num_workers to try")
    args = parser.parse_args()
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    out = {"busy": args.busy, "seconds": args.seconds}
    try:
        for name, env in ENVS.items():
            flags = env + ["--train_for_seconds", str(args.seconds)]
            lines = []
            auto = run_train(flags, 10 * args.seconds + 120, inspect=lambda d, e: lines.extend(_auto_lines(d, e)))
            rates = {}
            for workers in args.workers.split(","):
                rates[workers] = run_train(flags + ["--num_workers", workers], 10 * args.seconds + 120)[
                    "env_steps_per_sec"
                ]
                print(name, "workers", workers, rates[workers], file=sys.stderr)
            best = max(rates, key=rates.get)
            print(name, "auto", auto["num_workers"], auto["env_steps_per_sec"], file=sys.stderr)
            out[name] = {
                "flags": env,
                "auto_workers": auto["num_workers"],
                "auto_env_steps_per_sec": auto["env_steps_per_sec"],
                "hand_set": rates,
                "best_workers": int(best),
                "best_env_steps_per_sec": rates[best],
                "auto_vs_best": round(auto["env_steps_per_sec"] / rates[best], 3),
                "auto_sizing": lines,
            }
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    print(json.dumps(out))


def _auto_lines(train_dir: str, experiment: str) -> list:
    """The auto sizing lines of the run's log."""
    with open(os.path.join(train_dir, experiment, "train.log")) as f:
        return [line.split("auto sizing: ", 1)[1].strip() for line in f if "auto sizing: " in line]


if __name__ == "__main__":
    main()
