"""Ours and Stable-Baselines3-contrib's at equal env steps, one after the other on this machine: each trains --algo on
its env for --env_steps, then its final policy plays --episodes whole games greedily. The figure is the clock (launch
to exit of the training, imports included, evaluation excluded) at the same env steps, and each final policy's score.

  python perf/equal_env_steps.py --algo qrdqn --env Breakout-v5 --sb3_env BreakoutNoFrameskip-v4 --env_steps 100000
  python perf/equal_env_steps.py --algo qrdqn --env CartPole-v1 --env_steps 50000 --replay_size 50000 --skip sb3
  python perf/equal_env_steps.py --algo crossq --env Pendulum-v1 --env_steps 20000 -- --compile false

Ours: train.py --env ENV --algo ALGO --train_for_env_steps N (the env family's defaults; --replay_size when given,
flags after -- too), then enjoy.py --num_episodes E --max_episode_steps 3000 on its last checkpoint (acting greedily
where the algorithm does: dqn, qrdqn, sac, td3, crossq). Theirs: perf/sb3_contrib.sh --algo ALGO --env SB3_ENV
--env_steps N --final_eval --eval_episodes E --threads 2 (RL Zoo's settings for the env, --buffer_size = --replay_size
when given; on Atari its AtariWrapper, whose Monitor reports whole games' scores, as ours does). Prints each run
(stderr) and one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, run_baseline, run_train  # noqa: E402


def _last_json(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def run_ours(args, extra: list) -> dict:
    """train.py for --env_steps in a temporary train_dir, then enjoy.py's greedy games of its final policy."""
    flags = ["--env", args.env, "--algo", args.algo, "--train_for_env_steps", str(args.env_steps)]
    flags += ["--train_for_seconds", str(args.limit_sec)]
    flags += ["--replay_size", str(args.replay_size)] if args.replay_size else []
    replay = {}

    def play(train_dir: str, experiment: str) -> None:
        enjoy = [sys.executable, os.path.join(REPO, "enjoy.py"), "--train_dir", train_dir, "--experiment", experiment]
        enjoy += ["--num_episodes", str(args.episodes), "--max_episode_steps", "3000"]
        replay.update(_last_json(subprocess.run(enjoy, cwd=REPO, capture_output=True, text=True).stdout))

    summary = run_train(flags + extra, args.limit_sec + 600, inspect=play)
    return {
        "env_steps": summary["env_steps"],
        "wall_sec": summary["launch_to_exit_sec"],
        "env_steps_per_sec": summary["env_steps_per_sec"],
        "updates": summary["learner_version"],
        "replay_ratio": summary.get("replay_ratio"),
        "episode_return_mean": summary["episode_return_mean"],
        "greedy_return_mean": replay.get("return_mean"),
        "num_workers": summary["num_workers"],
        "num_envs_per_worker": summary["num_envs_per_worker"],
    }


def run_theirs(args) -> dict:
    """Stable-Baselines3-contrib's ALGO at RL Zoo's settings for --env_steps (perf/sb3_contrib.sh, its own venv)."""
    cmd = [os.path.join(REPO, "perf", "sb3_contrib.sh"), "--algo", args.algo, "--env", args.sb3_env or args.env]
    cmd += ["--env_steps", str(args.env_steps), "--seconds", str(args.limit_sec), "--threads", "2"]
    cmd += ["--final_eval", "--eval_episodes", str(args.episodes)]
    cmd += ["--buffer_size", str(args.replay_size)] if args.replay_size else []
    out = run_baseline(cmd, timeout_sec=args.limit_sec + 1800)
    evals = out.get("evals") or []
    return {
        "env_steps": out["env_steps"],
        "wall_sec": out["wall_sec"],
        "env_steps_per_sec": out["env_steps_per_sec"],
        "updates": out.get("gradient_steps"),
        "replay_ratio": out.get("replay_ratio"),
        "episode_return_mean": out["episode_return_mean"],
        "greedy_return_mean": evals[-1][2] if evals else None,
        "settings": out.get("settings"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--algo", default="qrdqn", choices=("qrdqn", "crossq"), help="ours and SB3-contrib's")
    parser.add_argument("--env", default="Breakout-v5", help="our env id")
    parser.add_argument("--sb3_env", default=None, help="theirs, where its id differs (BreakoutNoFrameskip-v4)")
    parser.add_argument("--env_steps", type=int, default=100_000, help="env steps each trains for")
    parser.add_argument("--replay_size", type=int, default=None, help="both replays' size (default: each its own)")
    parser.add_argument("--episodes", type=int, default=10, help="greedy games of each final policy")
    parser.add_argument("--limit_sec", type=float, default=7200.0, help="a run's seconds at most")
    parser.add_argument("--skip", default="", help="'sb3': our run alone")
    args, extra = parser.parse_known_args()
    extra = [flag for flag in extra if flag != "--"]
    result = {"algo": args.algo, "env": args.env, "env_steps": args.env_steps, "flags": extra}
    result["replay_size"] = args.replay_size
    result["sf_engine"] = run_ours(args, extra)
    print("sf_engine", json.dumps(result["sf_engine"]), file=sys.stderr, flush=True)
    if "sb3" not in args.skip.split(","):
        result["sb3_contrib"] = run_theirs(args)
        print("sb3_contrib", json.dumps(result["sb3_contrib"]), file=sys.stderr, flush=True)
        ours, theirs = result["sf_engine"]["wall_sec"], result["sb3_contrib"]["wall_sec"]
        result["seconds_ratio_theirs_to_ours"] = round(theirs / ours, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
