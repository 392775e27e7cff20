"""A league against self-play alone, on Connect Four, side by side for the same minutes on the same machine.

  python perf/league.py --seconds 1200 --keep /tmp/league_runs
Trains two runs at once with the same flags and seed (each gets about half the machine): `--league --num_policies 3`
and plain self-play with the opponent pool (--self_play_flags). Then plays the league's main agent (policy 0) and
the self-play policy against the scripted player (sf_engine.envs.opponents:connect_four_heuristic, --games greedy
games, seats swapped) and against each other (--games games, both sampling), and draws the league's payoff table
(payoff.png). Keeps both experiment folders under --keep. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, run_train  # noqa: E402
from opponent_sampling import HEURISTIC, _final_checkpoint, _match  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--env", default="pettingzoo.classic.connect_four_v3:env")
    parser.add_argument("--seconds", type=float, default=1200.0, help="seconds of training of each run")
    parser.add_argument("--games", type=int, default=200, help="games per match")
    parser.add_argument("--flags", default="--num_workers 1 --num_envs_per_worker 128 --seed 1", help="both runs'")
    parser.add_argument("--league_flags", default="--league --num_policies 3 --pool_size 16")
    parser.add_argument("--self_play_flags", default="--pool_every_versions 25 --pool_share 0.5")
    parser.add_argument("--keep", required=True, help="folder that keeps each run's experiment folder")
    args = parser.parse_args()
    os.makedirs(args.keep, exist_ok=True)
    common = ["--env", args.env, "--train_for_seconds", str(args.seconds), "--train_for_env_steps", str(10**12)]
    common += ["--save_every_sec", "60"] + args.flags.split()
    runs = {"league": args.league_flags.split(), "self_play": args.self_play_flags.split()}

    def train(name: str) -> dict:
        def keep_it(train_dir: str, experiment: str) -> None:
            shutil.rmtree(os.path.join(args.keep, name), ignore_errors=True)
            shutil.copytree(os.path.join(train_dir, experiment), os.path.join(args.keep, name))

        summary = run_train(common + runs[name], timeout_sec=args.seconds + 900, inspect=keep_it)
        return {key: summary[key] for key in ("env_steps", "env_steps_per_sec", "learner_version", "ratings")}

    with ThreadPoolExecutor(len(runs)) as pool:
        trained = dict(zip(runs, pool.map(train, runs)))
    matches = {f"{name} vs heuristic": _match(args.keep, name, HEURISTIC, args.games, True) for name in runs}
    opponent = _final_checkpoint(os.path.join(args.keep, "self_play"))
    matches["league vs self_play"] = _match(args.keep, "league", opponent, args.games, deterministic=False)
    drawn = subprocess.run(
        [sys.executable, "-m", "sf_engine.selfplay.payoff", os.path.join(args.keep, "league")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    with open(os.path.join(args.keep, "league", "payoff.json")) as f:
        players = json.load(f)["players"]
    print(
        json.dumps(
            {
                "env": args.env,
                "seconds": args.seconds,
                "flags": args.flags,
                "runs": trained,
                "league_players": len(players),
                "payoff_png": drawn.stdout.strip() if drawn.returncode == 0 else drawn.stderr.strip()[-300:],
                **matches,
            }
        )
    )


if __name__ == "__main__":
    main()
