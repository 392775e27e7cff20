"""Seconds from launch to a solved CartPole-v1 with the value-based algorithms, against Stable-Baselines3 in the
same run.

  python perf/value_cartpole.py --algo dqn        # greedy evaluation >= 475 (every 5 s, 10 episodes), vs SB3's DQN
  python perf/value_cartpole.py --algo pqn        # mean training return of the last 100 episodes >= 475
  python perf/value_cartpole.py --algo qrdqn --limit_sec 120   # greedy >= 475, vs Stable-Baselines3-contrib's QRDQN
  python perf/value_cartpole.py --algo dqn --rounds 3 --no_baseline -- --learning_rate 2e-3
  python perf/value_cartpole.py --algo dqn --rounds 5 --no_baseline --hold_sec 180   # does it hold 475? seeds 0-4
  python perf/value_cartpole.py --algo r2d2 --env CartPoleNoVel-v1 --rounds 2 --hold_sec 180   # velocities hidden

--algo dqn (and r2d2): train.py --algo dqn --eval_every_sec 5 --eval_episodes 10 --stop_at_eval_return 475; the time is
that of the first evaluation line at or above 475, from the launch of train.py (imports and start-up included:
the user's wait). Stable-Baselines3 2.9.2 (../shared/baselines/sb3.sh, RL Zoo's tuned CartPole DQN, greedy
evaluation every 5 s of its training, its evaluation time not counted) runs after each of ours; where it never
reaches 475 within its zoo budget, its whole run's seconds are a lower bound of its time (the ratio says so).
--algo qrdqn: as dqn, against Stable-Baselines3-contrib 2.9.2's QRDQN at RL Zoo's CartPole settings
(perf/sb3_contrib.sh, its own venv).
--algo pqn: train.py --algo pqn --stop_at_return 475; the time of the 'stopped:' line. --hold_sec H: each of our
runs (round i with --seed i) goes on H seconds after its first evaluation at 475 or more, evaluating every 10 s,
then stops (Ctrl-C's clean stop); its `held_share` is the share of the evaluations of those H seconds at 475 or more
(perf/common.py's held_share; for pqn the evaluations are added). Prints each run (stderr) and one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import EVAL_LINE, REPO, held_share, run_baseline  # noqa: E402

THRESHOLD = 475.0


def run_ours(
    algo: str, extra: list, limit_sec: float, hold_sec: float | None = None, seed: int | None = None, env: str = ""
) -> dict:
    """train.py on `env` (CartPole-v1 by default) in a new process; the seconds from its launch to the solved line
    (None: not within limit_sec); with `hold_sec`, it goes on that long after it and is stopped, and the share of the
    evaluations meanwhile at 475."""
    goal = ["--eval_every_sec", "5", "--eval_episodes", "10", "--stop_at_eval_return", str(THRESHOLD)]
    if algo == "pqn":
        goal = ["--stop_at_return", str(THRESHOLD)]
    if hold_sec is not None:
        goal = ["--eval_every_sec", "10", "--eval_episodes", "10"] + (["--seed", str(seed)] if seed is not None else [])
        limit_sec += hold_sec
    with tempfile.TemporaryDirectory(prefix="sf_engine_perf_") as train_dir:
        cmd = [sys.executable, os.path.join(REPO, "train.py"), "--train_dir", train_dir, "--experiment", "perf"]
        cmd += ["--env", env or "CartPole-v1", "--algo", algo, "--train_for_seconds", str(limit_sec)]
        cmd += ["--status_every_sec", "1000", *goal, *extra]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        solved, evaluations, stopped = None, [], False
        for line in proc.stdout:
            now = round(time.monotonic() - start, 2)
            found = EVAL_LINE.search(line)
            if found:
                evaluations.append((now, int(found.group(1)), float(found.group(2))))
                if solved is None and float(found.group(2)) >= THRESHOLD:
                    solved = now
            if algo == "pqn" and line.startswith("stopped: mean return") and solved is None:
                solved = now
            if hold_sec is not None and solved is not None and now > solved + hold_sec and not stopped:
                proc.send_signal(signal.SIGINT)  # the hold measured: the clean stop
                stopped = True
        proc.wait()
        with open(os.path.join(train_dir, "perf", "summary.json")) as f:
            summary = json.load(f)
    return {
        "seconds_to_475": solved,
        "env_steps": summary["env_steps"],
        "env_steps_per_sec": summary["env_steps_per_sec"],
        "frames_per_sec": summary["frames_per_sec"],
        "num_workers": summary["num_workers"],
        "num_envs_per_worker": summary["num_envs_per_worker"],
        "policy_lag_mean": summary["policy_lag_mean"],
        "episode_return_mean": summary["episode_return_mean"],
        "eval_return_mean": summary["eval_return_mean"],
        "wall_sec": summary["wall_sec"],
        "replay_ratio": summary.get("replay_ratio"),
        "evaluations": evaluations,
        "held_share": None if hold_sec is None else held_share(evaluations, THRESHOLD, hold_sec),
        "launch_to_exit_sec": round(time.monotonic() - start, 2),
    }


def run_sb3(algo: str) -> dict:
    """Stable-Baselines3's DQN (the shared baseline), or for qrdqn Stable-Baselines3-contrib's QRDQN (perf/'s)."""
    if algo == "qrdqn":
        cmd = [os.path.join(REPO, "perf", "sb3_contrib.sh"), "--algo", "qrdqn", "--env", "CartPole-v1"]
    else:
        cmd = [os.path.join(REPO, "..", "shared", "baselines", "sb3.sh"), "--algo", "dqn", "--env", "CartPole-v1"]
    cmd += ["--eval_every_sec", "5", "--stop_at_eval_return", str(THRESHOLD)]
    out = run_baseline(cmd, timeout_sec=900)
    reached = out.get("seconds_to_eval_threshold")
    return {
        "seconds_to_475": reached,
        "lower_bound_sec": None if reached is not None else out["wall_sec"],
        "env_steps": out["env_steps"],
        "env_steps_per_sec": out["env_steps_per_sec"],
        "replay_ratio": out.get("replay_ratio"),
        "best_eval": max((e[-1] for e in out.get("evals", []) if e and e[-1] is not None), default=None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--algo", choices=("dqn", "pqn", "r2d2", "qrdqn"), default="dqn")
    parser.add_argument("--env", default="CartPole-v1", help="a CartPole of 500 steps (CartPoleNoVel-v1 for r2d2)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each system, alternating")
    parser.add_argument("--limit_sec", type=float, default=60.0, help="our run's --train_for_seconds")
    parser.add_argument("--no_baseline", action="store_true", help="skip Stable-Baselines3 (dqn, qrdqn)")
    parser.add_argument("--hold_sec", type=float, default=None, help="measure the hold of 475 for this long")
    parser.add_argument("train_args", nargs="*", help="more flags for train.py (after --)")
    args = parser.parse_args()
    ours, theirs = [], []
    for round_index in range(args.rounds):
        seed = round_index if args.hold_sec is not None and "--seed" not in args.train_args else None
        ours.append(run_ours(args.algo, args.train_args, args.limit_sec, args.hold_sec, seed, args.env))
        print("sf_engine:", json.dumps(ours[-1]), file=sys.stderr, flush=True)
        if args.algo in ("dqn", "qrdqn") and args.env == "CartPole-v1" and not args.no_baseline:
            theirs.append(run_sb3(args.algo))
            print("stable-baselines3:", json.dumps(theirs[-1]), file=sys.stderr, flush=True)
    times = [r["seconds_to_475"] for r in ours]
    median = statistics.median(times) if None not in times else None
    result = {
        "env": args.env,
        "algo": args.algo,
        "mode": "async",
        "rounds": args.rounds,
        "seconds_to_475": times,
        "seconds_to_475_median": median,
        "env_steps_per_sec": statistics.median(r["env_steps_per_sec"] for r in ours),
        "frames_per_sec": statistics.median(r["frames_per_sec"] for r in ours),
        "num_workers": ours[-1]["num_workers"],
        "num_envs_per_worker": ours[-1]["num_envs_per_worker"],
        "policy_lag_mean": ours[-1]["policy_lag_mean"],
        "episode_return_mean": ours[-1]["episode_return_mean"],
        "wall_sec": statistics.median(r["wall_sec"] for r in ours),
        "replay_ratio": ours[-1]["replay_ratio"],
    }
    if args.hold_sec is not None:
        result["held_share"] = [r["held_share"] for r in ours]
    if theirs:
        bounds = [r["seconds_to_475"] or r["lower_bound_sec"] for r in theirs]
        result["sb3_seconds_to_475"] = [r["seconds_to_475"] for r in theirs]
        result["sb3_best_eval"] = [r["best_eval"] for r in theirs]
        result["sb3_env_steps_per_sec"] = statistics.median(r["env_steps_per_sec"] for r in theirs)
        if median:
            speedup = statistics.median(bounds) / median
            never = any(r["seconds_to_475"] is None for r in theirs)
            result["speedup_vs_sb3"] = round(speedup, 2)
            result["speedup_is_lower_bound"] = never  # SB3 never reached 475: its whole run's seconds
    print(json.dumps(result))


if __name__ == "__main__":
    main()
