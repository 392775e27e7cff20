"""Population-based training against the same population without it, on a learning rate too small to learn.

  python perf/pbt_check.py --env CartPole-v1 --policies 4 --learning_rate 3e-6 --seconds 120
Runs train.py --num_policies N --learning_rate LR --train_for_seconds S twice, with --pbt and without,
back to back (the default env-step budget may stop a run sooner). Prints one JSON line: per run each
member's mean return (its last 100 episodes), the best of them, its wall time, and with --pbt the
rounds, exploits and the members' final learning rates.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import run_train  # noqa: E402


def _figures(summary: dict) -> dict:
    returns = [p["episode_return_mean"] for p in summary["policies"] or []]
    out = {
        "returns": [None if r is None else round(r, 1) for r in returns],
        "best_return": max((r for r in returns if r is not None), default=None),
        "wall_sec": summary["wall_sec"],
        "env_steps": summary["env_steps"],
    }
    if summary.get("pbt"):
        pbt = summary["pbt"]
        out.update(
            {
                "rounds": pbt["rounds"],
                "exploits": len(pbt["exploits"]),
                "learning_rates": [h["learning_rate"] for h in pbt["hyperparameters"]],
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--policies", type=int, default=4, help="--num_policies of both runs")
    parser.add_argument("--learning_rate", default="3e-6")
    parser.add_argument("--seconds", type=float, default=120.0, help="--train_for_seconds of each run")
    parser.add_argument("--flags", default="", help="more train.py flags for both runs, as one string")
    args = parser.parse_args()
    flags = [
        "--env",
        args.env,
        "--num_policies",
        str(args.policies),
        "--learning_rate",
        args.learning_rate,
        "--train_for_seconds",
        str(args.seconds),
    ] + args.flags.split()
    with_pbt = run_train(flags + ["--pbt"], timeout_sec=args.seconds + 300)
    without = run_train(flags, timeout_sec=args.seconds + 300)
    print(
        json.dumps(
            {
                "env": args.env,
                "policies": args.policies,
                "learning_rate": args.learning_rate,
                "seconds": args.seconds,
                "pbt": _figures(with_pbt),
                "no_pbt": _figures(without),
            }
        )
    )


if __name__ == "__main__":
    main()
