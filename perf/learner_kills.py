"""What repeated learner deaths cost a run: the same command (same --seed) run undisturbed and with its learner
SIGKILLed every --every seconds, one after the other, and their returns compared.

  python perf/learner_kills.py -- --algo sac --env Pendulum-v1
  python perf/learner_kills.py --threshold 475 -- --algo dqn --env CartPole-v1

Each run: train.py with the flags after `--`, --seed 0 unless given, --train_for_seconds --seconds, a greedy
evaluation every --eval_every_sec seconds of 10 episodes, no periodic checkpoint (--save_every_sec 100000: what a
restarted learner finds is what the dead one kept or published, not a checkpoint). Reads, per run: the training
return at the end (summary.json's mean of the last episodes), every evaluation line, the learner's restarts and what
each recovered; with --threshold, the share of the evaluations after the first one at or above it (within
--hold_sec of it) that stay at or above it (DQN's hold on CartPole: docs/value-based.md). From the undisturbed run,
the cost of keeping the learner's training state: its learner's `checkpoint` stage (every keep, plus the one
checkpoint at the stop) against its `train` stage. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import EVAL_LINE, REPO, held_share, learner_pid, read_json  # noqa: E402


def run(flags: list, seconds: float, every: float | None, eval_every: float) -> dict:
    """train.py with `flags` for `seconds`; its learner killed every `every` seconds (None: never)."""
    with tempfile.TemporaryDirectory(prefix="sf_engine_perf_") as train_dir:
        exp_dir = os.path.join(train_dir, "kills")
        cmd = [sys.executable, os.path.join(REPO, "train.py"), "--train_dir", train_dir, "--experiment", "kills"]
        cmd += ["--train_for_seconds", str(seconds), "--save_every_sec", "100000", "--status_every_sec", "1000"]
        cmd += ["--eval_every_sec", str(eval_every), "--eval_episodes", "10"]
        cmd += flags if "--seed" in flags else flags + ["--seed", "0"]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        evaluations, kills = [], []

        def read_lines():
            for line in proc.stdout:
                found = EVAL_LINE.search(line)
                if found:
                    evaluations.append((round(time.monotonic() - start, 1), int(found.group(1)), float(found.group(2))))

        reader = threading.Thread(target=read_lines, daemon=True)
        reader.start()
        while proc.poll() is None:
            time.sleep(0.2)
            elapsed = time.monotonic() - start
            if every and elapsed >= every * (len(kills) + 1) and elapsed < seconds - 5:
                pid = learner_pid(exp_dir)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    kills.append(round(elapsed, 1))
        reader.join()
        summary = read_json(os.path.join(exp_dir, "summary.json"))
    learner = summary.get("stage_seconds", {}).get("learner", {})
    return {
        "exit_code": proc.returncode,
        "episode_return_mean": summary.get("episode_return_mean"),
        "env_steps": summary.get("env_steps"),
        "learner_version": summary.get("learner_version"),
        "kills_at_sec": kills,
        "learner_restarts": summary.get("learner_restarts"),
        "learner_recoveries": summary.get("learner_recoveries"),
        "evaluations": evaluations,
        "keep_share_of_train": round(learner.get("checkpoint", 0.0) / learner["train"], 4) if learner else None,
        "unaccounted": summary.get("env_step_books", {}).get("unaccounted"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--seconds", type=float, default=150.0, help="length of each run")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between two kills of the learner")
    parser.add_argument("--eval_every_sec", type=float, default=10.0, help="seconds between greedy evaluations")
    parser.add_argument("--threshold", type=float, default=None, help="the return whose hold is measured")
    parser.add_argument("--hold_sec", type=float, default=180.0, help="seconds after reaching it that count")
    parser.add_argument("train_args", nargs="*", help="flags for train.py (after --)")
    args = parser.parse_args()
    out = {"bench": "learner_kills", "flags": " ".join(args.train_args), "seconds": args.seconds, "every": args.every}
    for name, every in (("undisturbed", None), ("killed", args.every)):
        result = run(args.train_args, args.seconds, every, args.eval_every_sec)
        if args.threshold is not None:
            result["held_share"] = held_share(result["evaluations"], args.threshold, args.hold_sec)
        print(f"{name}: {json.dumps(result)}", file=sys.stderr, flush=True)
        out[name] = result
    returns = [out[name]["episode_return_mean"] for name in ("undisturbed", "killed")]
    if None not in returns and returns[0]:
        out["killed_return_vs_undisturbed"] = round(returns[1] / returns[0], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
