"""A BabyAI level with its mission read (--text_obs bag: a bag of its words) and left out (--text_obs drop), the
same minutes each, one after the other on this machine, at the defaults (the image family's): the mean return of
the last 100 episodes at the end of each, the env steps each made, and the ratio. One JSON line last.

  python perf/mission.py                                   # BabyAI-GoToRedBallGrey-v0, 10 minutes each
  python perf/mission.py --env minigrid:BabyAI-GoToLocal-v0 --minutes 5
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import run_train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="minigrid:BabyAI-GoToRedBallGrey-v0")
    parser.add_argument("--minutes", type=float, default=10.0, help="training minutes of each run")
    args, extra = parser.parse_known_args()
    result = {"env": args.env, "minutes": args.minutes, "flags": extra}
    for text in ("bag", "drop"):
        flags = ["--env", args.env, "--text_obs", text, "--train_for_seconds", str(60 * args.minutes), *extra]
        summary = run_train(flags, 60 * args.minutes + 300)
        keys = ("episode_return_mean", "env_steps", "env_steps_per_sec", "num_workers", "num_envs_per_worker")
        result[f"mission {'read' if text == 'bag' else 'left out'}"] = {key: summary[key] for key in keys}
        print(text, json.dumps(result), file=sys.stderr, flush=True)
    read, left = result["mission read"]["episode_return_mean"], result["mission left out"]["episode_return_mean"]
    result["read_over_left_out"] = round(read / left, 3) if left else None
    print(json.dumps(result))


if __name__ == "__main__":
    main()
