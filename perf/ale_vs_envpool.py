"""Gymnasium's ALE id against EnvPool's id of the same game, each trained for the same minutes at the Atari family's
defaults, one after the other on this machine: env steps/s and frames/s of each, and the mean episode return of
each over the same env steps (the last --window of env steps that both runs reached), which should be within noise
of each other (the same preprocessing, the same learning).

  python perf/ale_vs_envpool.py                                    # Breakout, 10 minutes each
  python perf/ale_vs_envpool.py --game Pong --minutes 5 --train_dir /tmp/ale   # keep the runs (TensorBoard)
  python perf/ale_vs_envpool.py --seed 1                           # another seed of both

Needs ale-py (pip install -e '.[atari]') and EnvPool. Prints each run (stderr) and one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train(env: str, experiment: str, minutes: float, train_dir: str, seed: int) -> dict:
    """One run of train.py on `env` for `minutes`; its summary.json."""
    cmd = [sys.executable, os.path.join(REPO, "train.py"), "--env", env, "--train_dir", train_dir]
    cmd += ["--experiment", experiment, "--restart", "--train_for_seconds", str(60 * minutes), "--seed", str(seed)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"train.py exited with {proc.returncode} on {env}")
    with open(os.path.join(train_dir, experiment, "summary.json")) as f:
        return json.load(f)


def returns(experiment_dir: str) -> list:
    """(env steps, episode return) of every episode/return point the run logged."""
    events = EventAccumulator(experiment_dir, size_guidance={"scalars": 0})
    events.Reload()
    return [(p.step, p.value) for p in events.Scalars("episode/return")]


def mean_between(points: list, low: float, high: float) -> float | None:
    values = [value for step, value in points if low <= step <= high]
    return sum(values) / len(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", default="Breakout", help="the game's name in both ids (Breakout: Breakout-v5)")
    parser.add_argument("--minutes", type=float, default=10.0, help="training minutes of each run")
    parser.add_argument("--window", type=float, default=0.2, help="share of the common env steps averaged, at the end")
    parser.add_argument("--seed", type=int, default=0, help="both runs' --seed")
    parser.add_argument("--train_dir", default=None, help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    ids = {"gymnasium": f"ale_py:ALE/{args.game}-v5", "envpool": f"{args.game}-v5"}
    with tempfile.TemporaryDirectory(prefix="sf_engine_perf_") as temporary:
        train_dir = args.train_dir or temporary
        runs = {}
        for name, env in ids.items():
            summary = train(env, f"ale_{name}", args.minutes, train_dir, args.seed)
            runs[name] = {"summary": summary, "returns": returns(os.path.join(train_dir, f"ale_{name}"))}
            print(name, env, json.dumps({k: summary[k] for k in ("env_steps", "env_steps_per_sec")}), file=sys.stderr)
    common = min(max(step for step, _ in run["returns"]) for run in runs.values())
    low = (1 - args.window) * common
    out = {
        "game": args.game,
        "minutes": args.minutes,
        "seed": args.seed,
        "common_env_steps": common,
        "window": [round(low), common],
    }
    for name, run in runs.items():
        summary = run["summary"]
        out[name] = {
            "env": ids[name],
            "env_steps": summary["env_steps"],
            "env_steps_per_sec": summary["env_steps_per_sec"],
            "frames_per_sec": summary["frames_per_sec"],
            "num_workers": summary["num_workers"],
            "return_at_common_env_steps": mean_between(run["returns"], low, common),
            "return_at_end": summary["episode_return_mean"],
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
