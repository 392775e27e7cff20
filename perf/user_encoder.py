"""What a user's own network costs: CartPole-v1 to a mean return of 475 over the last 100 episodes, seconds from
launch to exit, with the built-in encoder (train.py), with a user's MLP encoder of the built-in size in a file of
the user's directory (train.py --encoder my_encoder:make: two tanh layers of 64, the built-in's size, which
takes autograd's path instead of the compiled kernels), and with that run started from sf_engine.train(...) in the
user's script; the three interleaved in each round. Prints each run (stderr) and one JSON line last: the medians
and the ratios user / built-in and script / train.py.

  python perf/user_encoder.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO  # noqa: E402

ENCODER = """
import torch


def make(observation_space):
    size = int(observation_space.shape[0])
    return torch.nn.Sequential(torch.nn.Linear(size, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh())
"""
SCRIPT = """
import sys

import sf_engine

if __name__ == "__main__":
    sf_engine.train(encoder="my_encoder:make", train_dir=sys.argv[1], experiment="perf", stop_at_return=475,
                    train_for_seconds=120, status_every_sec=1000)
"""
FLAGS = ["--experiment", "perf", "--stop_at_return", "475", "--train_for_seconds", "120", "--status_every_sec", "1000"]


def timed(command: list, user_dir: str, train_dir: str) -> dict:
    """The command run from the user's directory: seconds from launch to exit, and the mean return reached."""
    start = time.monotonic()
    proc = subprocess.run(command, cwd=user_dir, capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"exited with {proc.returncode}: {' '.join(command)}")
    with open(os.path.join(train_dir, "perf", "summary.json")) as f:
        summary = json.load(f)
    reached = summary["episode_return_mean"] is not None and summary["episode_return_mean"] >= 475
    return {"launch_to_exit_sec": round(elapsed, 2), "reached": reached, "env_steps": summary["env_steps"]}


def one_round(user_dir: str) -> dict:
    train = [sys.executable, os.path.join(REPO, "train.py")]
    out = {}
    for name, command in (
        ("built_in", train + FLAGS),
        ("user_encoder", train + FLAGS + ["--encoder", "my_encoder:make"]),
        ("script", [sys.executable, "my_script.py"]),
    ):
        with tempfile.TemporaryDirectory(prefix="sf_engine_perf_") as train_dir:
            flags = [train_dir] if name == "script" else ["--train_dir", train_dir]
            out[name] = timed(command + flags, user_dir, train_dir)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three runs")
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="sf_engine_user_") as user_dir:
        for name, text in (("my_encoder.py", ENCODER), ("my_script.py", SCRIPT)):
            with open(os.path.join(user_dir, name), "w") as f:
                f.write(textwrap.dedent(text))
        for _ in range(args.rounds):
            rounds.append(one_round(user_dir))
            print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    medians = {
        name: statistics.median(r[name]["launch_to_exit_sec"] for r in rounds)
        for name in ("built_in", "user_encoder", "script")
    }
    print(
        json.dumps(
            {
                "env": "CartPole-v1",
                "rounds": args.rounds,
                "all_reached_475": all(run["reached"] for r in rounds for run in r.values()),
                "median_sec_from_launch": medians,
                "user_encoder_over_built_in": round(medians["user_encoder"] / medians["built_in"], 2),
                "script_over_train_py": round(medians["script"] / medians["user_encoder"], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
