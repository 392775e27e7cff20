"""Does a policy learn the same with learner ranks (--num_learners) as with one learner? CartPole-v1 PPO at the same
global batch and sizes (1 worker x 256 envs, rollout 16: slots of 2,048 samples, 2 a batch), per seed with 1 and then
N ranks, in sync mode (no policy lag: the runs differ only by the ranks): the return curve read from the status lines
every half second, the env steps at which the mean return first reached 475, the throughput. One JSON line last.

  python perf/learner_ranks.py                          # seeds 0, 1, 2; 1 and 2 ranks; 600,000 env steps each
  python perf/learner_ranks.py --ranks 4 --env_steps 1000000 -- --mode async   # flags after -- go to every run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import run_train  # noqa: E402

STATUS = re.compile(r"env steps ([\d,]+) \|.*\| return (-?[\d.]+) \(last")
CHECKPOINTS = (100_000, 200_000, 300_000, 400_000, 500_000)  # env steps at which the curves are compared


def curve(train_dir: str, experiment: str) -> list:
    """(env steps, mean return of the last 100 episodes) of every status line of the run."""
    with open(os.path.join(train_dir, experiment, "train.log")) as f:
        return [(int(m.group(1).replace(",", "")), float(m.group(2))) for m in map(STATUS.search, f) if m]


def at(points: list, env_steps: int):
    """The return of the last status line at or before `env_steps` (None before the first)."""
    before = [ret for steps, ret in points if steps <= env_steps]
    return before[-1] if before else None


def run(ranks: int, seed: int, env_steps: int, flags: list) -> dict:
    points: list = []
    summary = run_train(
        ["--env", "CartPole-v1", "--mode", "sync", "--seed", str(seed), "--num_learners", str(ranks)]
        + ["--num_workers", "1", "--num_envs_per_worker", "256", "--rollout", "16"]
        + ["--train_for_env_steps", str(env_steps), "--status_every_sec", "0.5"]
        + flags,
        timeout_sec=900,
        inspect=lambda train_dir, experiment: points.extend(curve(train_dir, experiment)),
    )
    points.append((summary["env_steps"], summary["episode_return_mean"]))  # the run's end
    solved = next((steps for steps, ret in points if ret is not None and ret >= 475), None)
    return {
        "ranks": ranks,
        "seed": seed,
        "env_steps_to_475": solved,
        "final_return": summary["episode_return_mean"],
        "env_steps_per_sec": summary["env_steps_per_sec"],
        "returns_at": [at(points, c) for c in CHECKPOINTS],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2, help="the ranks compared with one learner")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--env_steps", type=int, default=600_000, help="each run's budget")
    args, flags = parser.parse_known_args()
    flags = [f for f in flags if f != "--"]
    runs = [run(ranks, seed, args.env_steps, flags) for seed in range(args.seeds) for ranks in (1, args.ranks)]
    for r in runs:
        print(json.dumps(r), file=sys.stderr, flush=True)
    by = {n: [r for r in runs if r["ranks"] == n] for n in (1, args.ranks)}
    out = {"bench": "learner_ranks", "env": "CartPole-v1", "flags": " ".join(flags), "checkpoints": CHECKPOINTS}
    for n, rows in by.items():
        solved = [r["env_steps_to_475"] for r in rows if r["env_steps_to_475"] is not None]
        out[f"ranks_{n}"] = {
            "env_steps_to_475": [r["env_steps_to_475"] for r in rows],
            "solved": f"{len(solved)}/{len(rows)}",
            "mean_return_at": [
                round(statistics.mean(v), 1)
                if len(v := [r["returns_at"][i] for r in rows if r["returns_at"][i]])
                else None
                for i in range(len(CHECKPOINTS))
            ],
            "env_steps_per_sec": [r["env_steps_per_sec"] for r in rows],
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
