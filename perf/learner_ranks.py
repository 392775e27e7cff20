"""Does a policy learn the same with learner ranks (--num_learners) as with one learner? Per seed a run with 1 and
then N ranks at the same global batch and sizes, in sync mode (no policy lag: the runs differ only by the ranks):
the return curve read from the status lines every half second (the mean of the last 100 episodes), the env steps
at which the target was first reached, the throughput. One JSON line last. Three set-ups (--algo):
  ppo  CartPole-v1, 1 worker x 256 envs, rollout 16 (slots of 2,048 samples, 2 a batch): a mean return of 475
  dqn  CartPole-v1 at DQN's defaults for it (each rank a buffer of half --replay_size, minibatches of half
       --batch_size): a greedy evaluation (every 2 s) of 475, where the run stops (epsilon-greedy episodes trail it)
  sac  Pendulum-v1 at SAC's defaults for it: a greedy evaluation (every 5 s) of -250, where the run stops (the
       mean of 100 episodes of 200 steps trails the policy by thousands of env steps)

  python perf/learner_ranks.py                          # ppo: seeds 0, 1, 2; 1 and 2 ranks; 600,000 env steps each
  python perf/learner_ranks.py --algo sac --env_steps 30000 --seeds 3
  python perf/learner_ranks.py --ranks 4 --env_steps 1000000 -- --mode async   # flags after -- go to every run
  python perf/learner_ranks.py --seeds 2 --shared_device cuda:0 -- --device cuda   # two ranks on the one GPU (gloo)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import run_train  # noqa: E402

STATUS = re.compile(r"env steps ([\d,]+) \|.*\| return (-?[\d.]+) \(last")
POINTS = 5  # the curves are compared at this many env steps, evenly spaced over the budget
SETUPS = {  # --algo: (env, the target return, the flags of its runs, whether the target is a greedy evaluation's)
    "ppo": ("CartPole-v1", 475.0, ["--num_workers", "1", "--num_envs_per_worker", "256", "--rollout", "16"], False),
    "dqn": ("CartPole-v1", 475.0, ["--algo", "dqn", "--eval_every_sec", "2", "--stop_at_eval_return", "475"], True),
    "sac": ("Pendulum-v1", -250.0, ["--algo", "sac", "--eval_every_sec", "5", "--stop_at_eval_return", "-250"], True),
}


def curve(train_dir: str, experiment: str) -> list:
    """(env steps, mean return of the last 100 episodes) of every status line of the run."""
    with open(os.path.join(train_dir, experiment, "train.log")) as f:
        return [(int(m.group(1).replace(",", "")), float(m.group(2))) for m in map(STATUS.search, f) if m]


def at(points: list, env_steps: int):
    """The return of the last status line at or before `env_steps` (None before the first)."""
    before = [ret for steps, ret in points if steps <= env_steps]
    return before[-1] if before else None


def run(algo: str, ranks: int, seed: int, env_steps: int, flags: list, shared_device: str = "") -> dict:
    env, target, own, evaluated = SETUPS[algo]
    if shared_device and ranks > 1:
        flags = flags + ["--learner_devices", ",".join([shared_device] * ranks)]
    points: list = []
    summary = run_train(
        ["--env", env, "--mode", "sync", "--seed", str(seed), "--num_learners", str(ranks)]
        + own
        + ["--train_for_env_steps", str(env_steps), "--status_every_sec", "0.5"]
        + flags,
        timeout_sec=1800,
        inspect=lambda train_dir, experiment: points.extend(curve(train_dir, experiment)),
    )
    points.append((summary["env_steps"], summary["episode_return_mean"]))  # the run's end
    if evaluated:  # the run stopped at the target
        solved = summary["env_steps"] if (summary["eval_return_best"] or -math.inf) >= target else None
    else:
        solved = next((steps for steps, ret in points if ret is not None and ret >= target), None)
    return {
        "ranks": ranks,
        "seed": seed,
        "env_steps_to_target": solved,
        "final_return": summary["episode_return_mean"],
        "eval_return_best": summary["eval_return_best"],
        "env_steps_per_sec": summary["env_steps_per_sec"],
        "returns_at": [at(points, c) for c in checkpoints(env_steps)],
    }


def checkpoints(env_steps: int) -> list:
    return [env_steps * (i + 1) // (POINTS + 1) for i in range(POINTS)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=sorted(SETUPS), default="ppo", help="the set-up compared (see above)")
    parser.add_argument("--ranks", type=int, default=2, help="the ranks compared with one learner")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--env_steps", type=int, default=600_000, help="each run's budget")
    parser.add_argument(
        "--shared_device",
        default="",
        help="every rank of the runs with --ranks on this one device (cuda:0: the ranks share the GPU, over gloo)",
    )
    args, flags = parser.parse_known_args()
    flags = [f for f in flags if f != "--"]
    runs = [
        run(args.algo, n, seed, args.env_steps, flags, args.shared_device)
        for seed in range(args.seeds)
        for n in (1, args.ranks)
    ]
    for r in runs:
        print(json.dumps(r), file=sys.stderr, flush=True)
    by = {n: [r for r in runs if r["ranks"] == n] for n in (1, args.ranks)}
    env, target, _, _ = SETUPS[args.algo]
    out = {
        "bench": "learner_ranks",
        "algo": args.algo,
        "env": env,
        "target": target,
        "flags": " ".join(flags),
        "shared_device": args.shared_device,
        "checkpoints": checkpoints(args.env_steps),
    }
    for n, rows in by.items():
        solved = [r["env_steps_to_target"] for r in rows if r["env_steps_to_target"] is not None]
        out[f"ranks_{n}"] = {
            "env_steps_to_target": [r["env_steps_to_target"] for r in rows],
            "solved": f"{len(solved)}/{len(rows)}",
            "mean_return_at": [
                round(statistics.mean(v), 1)
                if len(v := [r["returns_at"][i] for r in rows if r["returns_at"][i] is not None])
                else None
                for i in range(POINTS)
            ],
            "final_return": [r["final_return"] for r in rows],
            "env_steps_per_sec": [r["env_steps_per_sec"] for r in rows],
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
