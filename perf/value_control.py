"""Where the value-based defaults take the other classic-control envs: the last greedy evaluation after a budget of
env steps, per seed, so that a change tuned on CartPole can be checked not to cost Acrobot or MountainCar.

  python perf/value_control.py                                   # dqn on Acrobot-v1 and MountainCar-v0, seeds 0-1
  python perf/value_control.py --seeds 3 -- --learning_rate 1e-3  # more flags for train.py after --

Each run: train.py --algo ALGO --env ENV --seed S --train_for_env_steps STEPS --eval_every_sec 10
--eval_episodes 10; its last evaluation (summary.json's eval_return_mean) and every evaluation's return in
order (train.log's evaluation lines). Prints each run (stderr) and one JSON line last, with each env's median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import EVAL_LINE, run_train  # noqa: E402


def run_one(algo: str, env: str, seed: int, env_steps: int, extra: list) -> dict:
    returns = []

    def read_evaluations(train_dir: str, experiment: str) -> None:
        with open(os.path.join(train_dir, experiment, "train.log")) as f:
            returns.extend(float(found.group(2)) for found in map(EVAL_LINE.search, f) if found)

    flags = ["--algo", algo, "--env", env, "--seed", str(seed), "--train_for_env_steps", str(env_steps)]
    flags += ["--eval_every_sec", "10", "--eval_episodes", "10", *extra]
    summary = run_train(flags, timeout_sec=1800, inspect=read_evaluations)
    return {
        "env": env,
        "seed": seed,
        "last_eval": summary["eval_return_mean"],
        "evaluations": returns,
        "env_steps_per_sec": summary["env_steps_per_sec"],
        "launch_to_exit_sec": summary["launch_to_exit_sec"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--algo", default="dqn", help="the value-based algorithm to run")
    parser.add_argument("--envs", default="Acrobot-v1,MountainCar-v0", help="comma-separated env ids")
    parser.add_argument("--seeds", type=int, default=2, help="runs per env, --seed 0 .. N-1")
    parser.add_argument("--env_steps", type=int, default=500_000, help="each run's --train_for_env_steps")
    parser.add_argument("train_args", nargs="*", help="more flags for train.py (after --)")
    args = parser.parse_args()
    runs = []
    for env in args.envs.split(","):
        for seed in range(args.seeds):
            runs.append(run_one(args.algo, env, seed, args.env_steps, args.train_args))
            print("sf_engine:", json.dumps(runs[-1]), file=sys.stderr, flush=True)
    result = {"bench": "value_control", "algo": args.algo, "env_steps": args.env_steps, "flags": args.train_args}
    for env in args.envs.split(","):
        lasts = [r["last_eval"] for r in runs if r["env"] == env]
        result[env] = {"last_eval": lasts, "median": statistics.median(x for x in lasts if x is not None)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
