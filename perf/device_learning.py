"""The off-policy family and PQN on the shipped device envs against the same algorithm on Gymnasium's env, on this
machine's CPU, the two alternating: seconds from launch to the return each is asked for (as train.py stops there).

  python perf/device_learning.py                          # pqn CartPole, dqn Acrobot, sac and td3 Pendulum; 2 rounds
  python perf/device_learning.py --pairs sac --rounds 3

Each pair: (algorithm, torch id, Gymnasium id, the goal): PQN to a mean training return of 475 on CartPole
(--stop_at_return), DQN to a greedy evaluation of -100 on Acrobot, SAC and TD3 to one of -250 on Pendulum
(--eval_every_sec 5 --stop_at_eval_return), within --limit_sec. Prints each run (stderr) and one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import run_train  # noqa: E402

PAIRS = {
    "pqn": ("TorchCartPole-v1", "CartPole-v1", ["--stop_at_return", "475"], 475.0, "episode_return_mean"),
    "dqn": (
        "TorchAcrobot-v1",
        "Acrobot-v1",
        ["--eval_every_sec", "5", "--stop_at_eval_return", "-100"],
        -100.0,
        "eval_return_mean",
    ),
    "sac": (
        "TorchPendulum-v1",
        "Pendulum-v1",
        ["--eval_every_sec", "5", "--stop_at_eval_return", "-250"],
        -250.0,
        "eval_return_mean",
    ),
}
PAIRS["td3"] = PAIRS["sac"]  # the other continuous-action learner, on the same envs and goal


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--pairs", default="pqn,dqn,sac,td3", help="comma-separated algorithms of PAIRS")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--limit_sec", type=float, default=240.0, help="each run's --train_for_seconds")
    args = parser.parse_args()
    result = {"env": "torch ids vs Gymnasium ids", "mode": "async", "rounds": args.rounds, "limit_sec": args.limit_sec}
    for algo in args.pairs.split(","):
        device_id, gym_id, goal, threshold, figure = PAIRS[algo]
        times: dict = {device_id: [], gym_id: []}
        for round_index in range(args.rounds):
            for env in (device_id, gym_id) if round_index % 2 == 0 else (gym_id, device_id):
                flags = ["--env", env, "--algo", algo, "--seed", str(round_index), *goal]
                summary = run_train([*flags, "--train_for_seconds", str(args.limit_sec)], args.limit_sec + 180)
                reached = summary.get(figure) is not None and summary[figure] >= threshold
                times[env].append(summary["launch_to_exit_sec"] if reached else None)
                print(algo, env, json.dumps(summary), file=sys.stderr, flush=True)
        medians = {env: statistics.median(t) if None not in t else None for env, t in times.items()}
        result[algo] = {"goal": threshold, "seconds_from_launch": times, "medians": medians}
        if None not in medians.values():
            result[algo]["device_over_gymnasium"] = round(medians[device_id] / medians[gym_id], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
