"""Prioritized fictitious self-play against uniform sampling of the opponent pool, on Connect Four.

  python perf/opponent_sampling.py --seconds 600 --keep /tmp/pfsp_runs
Trains one run per --sampling entry (same seed and flags: --pool_every_versions 25 --pool_share 0.5 by default,
only --opponent_sampling differs), one after the other, then plays each final checkpoint against the other's
(--games games, seats swapped, both sampling their moves) and against the scripted player
(sf_engine.envs.opponents:connect_four_heuristic, greedy, as perf/self_play.py plays it). Keeps each run's
experiment folder under --keep (its TensorBoard scalars ratings/policy_0/mu, ...: perf/plot_curve.py draws
them). Prints one JSON line: per run its env steps, final ratings and games; the matches' figures.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import play_match, run_train  # noqa: E402

HEURISTIC = "sf_engine.envs.opponents:connect_four_heuristic"


def _final_checkpoint(experiment_dir: str) -> str:
    paths = sorted(glob.glob(os.path.join(experiment_dir, "checkpoints", "checkpoint_*.pt")))
    if not paths:
        raise SystemExit(f"no checkpoint in {experiment_dir}")
    return paths[-1]


def _match(keep: str, name: str, opponent: str, games: int, deterministic: bool) -> dict:
    """Run `name`'s final checkpoint (its experiment folder under --keep) against `opponent`: the match's figures."""
    return play_match(keep, name, _final_checkpoint(os.path.join(keep, name)), opponent, games, deterministic)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--env", default="pettingzoo.classic.connect_four_v3:env")
    parser.add_argument("--seconds", type=float, default=600.0, help="seconds of training per run")
    parser.add_argument("--sampling", default="uniform,pfsp", help="the --opponent_sampling of each run")
    parser.add_argument("--games", type=int, default=200, help="games per match")
    parser.add_argument("--flags", default="--pool_every_versions 25 --pool_share 0.5 --seed 1")
    parser.add_argument("--keep", required=True, help="folder that keeps each run's experiment folder")
    args = parser.parse_args()
    runs = args.sampling.split(",")
    os.makedirs(args.keep, exist_ok=True)
    trained = {}
    for name in runs:
        flags = ["--env", args.env, "--train_for_seconds", str(args.seconds), "--train_for_env_steps", str(10**12)]
        flags += ["--save_every_sec", "60", "--opponent_sampling", name] + args.flags.split()

        def keep_it(train_dir: str, experiment: str, name=name) -> None:
            shutil.rmtree(os.path.join(args.keep, name), ignore_errors=True)
            shutil.copytree(os.path.join(train_dir, experiment), os.path.join(args.keep, name))

        summary = run_train(flags, timeout_sec=args.seconds + 600, inspect=keep_it)
        trained[name] = {
            "env_steps": summary["env_steps"],
            "env_steps_per_sec": summary["env_steps_per_sec"],
            "version": summary["learner_version"],
            "ratings": summary["ratings"],
        }
    matches = {}
    for name in runs:
        matches[f"{name} vs heuristic"] = _match(args.keep, name, HEURISTIC, args.games, deterministic=True)
        for other in runs:
            if other != name and f"{other} vs {name}" not in matches:
                opponent = _final_checkpoint(os.path.join(args.keep, other))
                matches[f"{name} vs {other}"] = _match(args.keep, name, opponent, args.games, deterministic=False)
    print(json.dumps({"env": args.env, "seconds": args.seconds, "flags": args.flags, "runs": trained, **matches}))


if __name__ == "__main__":
    main()
