"""Self-play on a two-player game: train, then play the checkpoints against random and scripted opponents.

  python perf/self_play.py --seconds 1200 --at 10,20 --flags "--pool_every_versions 25 --pool_share 0.5"
Runs train.py on --env (Connect Four by default) for --seconds, a checkpoint a minute, then for each
minute of --at plays the last checkpoint written by then against each --opponents entry with
`enjoy.py --opponent OPPONENT --num_episodes GAMES --deterministic` (both seats, half each). Prints one
JSON line: per minute and opponent the win, draw and loss rates, and the run's summary figures.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import play_match, run_train  # noqa: E402


def _checkpoint_at(checkpoints: list, started: float, minute: float):
    """The last checkpoint file written within `minute` minutes of the launch (by its modification time)."""
    written = [(os.path.getmtime(path) - started, path) for path in checkpoints]
    before = [path for age, path in sorted(written) if age <= minute * 60 + 5]
    return before[-1] if before else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--env", default="pettingzoo.classic.connect_four_v3:env")
    parser.add_argument("--seconds", type=float, default=1200.0, help="seconds of training")
    parser.add_argument("--at", default="10,20", help="comma-separated minutes whose checkpoints are played")
    parser.add_argument(
        "--opponents",
        default="random,sf_engine.envs.opponents:connect_four_heuristic",
        help="comma-separated enjoy.py --opponent values",
    )
    parser.add_argument("--games", type=int, default=200, help="games per checkpoint and opponent")
    parser.add_argument("--flags", default="", help="more train.py flags, as one string")
    args = parser.parse_args()
    results = {}

    def play_checkpoints(train_dir: str, experiment: str) -> None:
        checkpoints = glob.glob(os.path.join(train_dir, experiment, "checkpoints", "*.pt"))
        for minute in [float(m) for m in args.at.split(",")]:
            path = _checkpoint_at(checkpoints, started, minute)
            if path is None:
                continue
            version = int(re.search(r"_v(\d+)_", os.path.basename(path)).group(1))
            results[f"{minute:g}"] = {
                "checkpoint_version": version,
                **{
                    opponent: play_match(train_dir, experiment, path, opponent, args.games, True)
                    for opponent in args.opponents.split(",")
                },
            }

    flags = [
        "--env",
        args.env,
        "--train_for_seconds",
        str(args.seconds),
        "--train_for_env_steps",
        str(10**12),
        "--save_every_sec",
        "60",
        "--keep_checkpoints",
        "1000",
    ] + args.flags.split()
    started = time.time()
    summary = run_train(flags, timeout_sec=args.seconds + 600, inspect=play_checkpoints)
    print(
        json.dumps(
            {
                "env": args.env,
                "seconds": args.seconds,
                "flags": args.flags,
                "at_minutes": results,
                "env_steps": summary["env_steps"],
                "env_steps_per_sec": summary["env_steps_per_sec"],
                "episodes": summary["episodes"],
                "bottleneck": summary["bottleneck"],
            }
        )
    )


if __name__ == "__main__":
    main()
