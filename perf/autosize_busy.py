"""Auto sizing on a loaded machine: with --busy processes spinning beside it (each a Python busy loop), training
env steps/s of `--num_workers auto` against each hand-set --num_workers, on a pure-Python Gymnasium env and on
EnvPool's CartPole, each run --seconds long; and the line auto sizing printed.

  python perf/autosize_busy.py                          # 2 busy loops, Acrobot-v1 (Gymnasium) and CartPole (EnvPool)
  python perf/autosize_busy.py --busy 0 --workers 1,2   # the same on a quiet machine
  python perf/autosize_busy.py --envs envpool --workers 1,2,3 --rounds 3   # medians of 3 interleaved rounds

Prints each run (stderr) and one JSON line last: per env the auto choices, the median env steps/s of auto and of each
hand-set number over the rounds, the best hand-set number, and the ratio auto / best.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
    parser.add_argument("--envs", default="python,envpool", help="which of: " + ", ".join(ENVS))
    rounds = "each setting once a round (the order reversed every other round); the median of its rounds"
    parser.add_argument("--rounds", type=int, default=1, help=rounds)
    args = parser.parse_args()
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    out = {"busy": args.busy, "seconds": args.seconds, "rounds": args.rounds}
    try:
        for name in args.envs.split(","):
            out[name] = _measure(name, args)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    print(json.dumps(out))


def _measure(name: str, args) -> dict:
    """Env `name`'s runs: auto and each hand-set number, --rounds times; the medians and the auto sizing lines."""
    flags = ENVS[name] + ["--train_for_seconds", str(args.seconds)]
    settings, runs, lines, chosen = ["auto"] + args.workers.split(","), {}, [], []
    for round_index in range(args.rounds):
        for setting in settings if round_index % 2 == 0 else settings[::-1]:
            if setting == "auto":
                inspect = None if lines else lambda d, e: lines.extend(_auto_lines(d, e))  # the first auto run's
                summary = run_train(flags, 10 * args.seconds + 120, inspect=inspect)
                chosen.append(summary["num_workers"])
            else:
                summary = run_train(flags + ["--num_workers", setting], 10 * args.seconds + 120)
            runs.setdefault(setting, []).append(summary["env_steps_per_sec"])
            print(name, setting, summary["num_workers"], summary["env_steps_per_sec"], file=sys.stderr, flush=True)
    rates = {setting: statistics.median(values) for setting, values in runs.items()}
    hand_set = {setting: rate for setting, rate in rates.items() if setting != "auto"}
    best = max(hand_set, key=hand_set.get)
    return {
        "flags": ENVS[name],
        "auto_workers": chosen,
        "auto_env_steps_per_sec": rates["auto"],
        "hand_set": hand_set,
        "runs": runs,
        "best_workers": int(best),
        "best_env_steps_per_sec": hand_set[best],
        "auto_vs_best": round(rates["auto"] / hand_set[best], 3),
        "auto_sizing": lines,
    }


def _auto_lines(train_dir: str, experiment: str) -> list:
    """The auto sizing lines of the run's log."""
    with open(os.path.join(train_dir, experiment, "train.log")) as f:
        return [line.split("auto sizing: ", 1)[1].strip() for line in f if "auto sizing: " in line]


if __name__ == "__main__":
    main()
