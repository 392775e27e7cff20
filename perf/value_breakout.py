"""Breakout-v5 for the same minutes with --algo dqn, --algo pqn and --algo ppo, one after the other on this machine,
each at its Atari defaults: the three training curves in one picture, and what each policy scores when replayed.

  python perf/value_breakout.py                                    # 15 minutes each, into train_dir/
  python perf/value_breakout.py --minutes 1 --out /tmp/three.png   # a quick look

Each run is train.py --env Breakout-v5 --algo ALGO --train_for_seconds 60 x minutes (experiment breakout_ALGO in
--train_dir, restarted), then enjoy.py replays its last checkpoint for --episodes episodes (greedy for dqn and
pqn, sampled for ppo, as each acts; the true game score). perf/plot_curve.py draws episode/return of the three
against minutes from launch (training episodes: dqn's explore with Ape-X's epsilons, pqn's with its decaying
epsilon, so a replay's score is the figure that compares). Prints one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALGOS = ("dqn", "pqn", "ppo")


def _last_json(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--minutes", type=float, default=15.0, help="training minutes of each run")
    parser.add_argument("--train_dir", default=os.path.join(REPO, "train_dir"))
    parser.add_argument("--episodes", type=int, default=5, help="replayed episodes of each final policy")
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "breakout_dqn_pqn_ppo.png"))
    args = parser.parse_args()
    python, result = sys.executable, {"env": "Breakout-v5", "minutes": args.minutes}
    for algo in ALGOS:
        experiment = f"breakout_{algo}"
        train = [python, os.path.join(REPO, "train.py"), "--env", "Breakout-v5", "--algo", algo, "--restart"]
        train += ["--train_for_seconds", str(60 * args.minutes), "--experiment", experiment]
        train += ["--train_dir", args.train_dir, "--status_every_sec", "30"]
        run = subprocess.run(train, cwd=REPO, capture_output=True, text=True)
        if run.returncode:
            sys.exit(f"{algo}: train.py exited with {run.returncode}:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
        with open(os.path.join(args.train_dir, experiment, "summary.json")) as f:
            summary = json.load(f)
        enjoy = [python, os.path.join(REPO, "enjoy.py"), "--experiment", experiment, "--train_dir", args.train_dir]
        enjoy += ["--num_episodes", str(args.episodes), "--max_episode_steps", "10000"]
        replay = _last_json(subprocess.run(enjoy, cwd=REPO, capture_output=True, text=True).stdout)
        result[algo] = {
            "env_steps": summary["env_steps"],
            "frames": summary["frames"],
            "frames_per_sec": summary["frames_per_sec"],
            "num_workers": summary["num_workers"],
            "num_envs_per_worker": summary["num_envs_per_worker"],
            "policy_lag_mean": summary["policy_lag_mean"],
            "episode_return_mean": summary["episode_return_mean"],
            "replay_ratio": summary.get("replay_ratio"),
            "bottleneck": summary["bottleneck"],
            "replayed_return_mean": replay.get("return_mean"),
            "replayed_episodes": args.episodes,
        }
        print(algo, json.dumps(result[algo]), file=sys.stderr, flush=True)
    plot = [python, os.path.join(REPO, "perf", "plot_curve.py")]
    plot += [os.path.join(args.train_dir, f"breakout_{algo}") for algo in ALGOS]
    plot += ["--tag", "episode/return", "--x", "minutes", "--labels", ",".join(ALGOS), "--out", args.out]
    subprocess.run(plot, cwd=REPO, check=True, capture_output=True)
    result["picture"] = os.path.relpath(args.out, REPO)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
