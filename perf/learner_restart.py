"""What a learner's death costs: a run is started, its learner killed with SIGKILL once the run has sampled
`--kill_at` env steps, and the run goes on to its budget.

  python perf/learner_restart.py                                  # CartPole-v1, default flags
  python perf/learner_restart.py --kill_at 300000 -- --env Pong-v5 --train_for_env_steps 600000

Reads the run's summary.json: the version seen before the kill (up to a second old) and the version
the restarted learner resumed at, the env steps dropped with the batch the dead learner held, the
seconds from the kill to the restarted learner's first new version (no training meanwhile), the
optimizer state it started from, and the return at the end. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, learner_pid, read_json  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--kill_at", type=int, default=1_500_000, help="env steps sampled before the kill")
    parser.add_argument("train_args", nargs="*", help="flags for train.py (after --)")
    args = parser.parse_args()
    train_dir = tempfile.mkdtemp(prefix="sf_engine_learner_restart_")
    exp_dir = os.path.join(train_dir, "restart")
    command = [sys.executable, os.path.join(REPO, "train.py"), "--train_dir", train_dir, "--experiment", "restart"]
    command += ["--status_every_sec", "1"] + (args.train_args or ["--train_for_env_steps", "5000000"])
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    while read_json(os.path.join(exp_dir, "summary.json")).get("env_steps", 0) < args.kill_at:
        if proc.poll() is not None:
            sys.exit(f"the run ended before {args.kill_at:,} env steps")
        time.sleep(0.05)
    before = read_json(os.path.join(exp_dir, "summary.json"))
    os.kill(learner_pid(exp_dir), signal.SIGKILL)
    killed = time.monotonic()
    while read_json(os.path.join(exp_dir, "summary.json")).get("learner_restarts", 0) < 1:
        time.sleep(0.01)
    resumed_version = None
    while proc.poll() is None:
        notes = read_json(os.path.join(exp_dir, "summary.json")).get("learner_recoveries") or []
        found = re.search(r"version (\d+)", notes[0]) if notes else None
        version = read_json(os.path.join(exp_dir, "summary.json")).get("learner_version", 0)
        if found and version > int(found.group(1)):
            resumed_version, training_again = int(found.group(1)), time.monotonic()
            break
        time.sleep(0.01)
    proc.wait()
    summary = read_json(os.path.join(exp_dir, "summary.json"))
    print(
        json.dumps(
            {
                "metric": "learner_restart",
                "exit_code": proc.returncode,
                "killed_at_env_steps": before.get("env_steps"),
                "version_seen_before_kill": before.get("learner_version"),  # summary.json: up to 1 s old
                "version_resumed": resumed_version,
                "recovery": (summary.get("learner_recoveries") or [None])[0],
                "env_steps_dropped": summary.get("env_step_books", {}).get("dropped_faults"),
                "seconds_without_a_new_version": round(training_again - killed, 2) if resumed_version else None,
                "learner_restarts": summary.get("learner_restarts"),
                "env_steps": summary.get("env_steps"),
                "episode_return_mean": summary.get("episode_return_mean"),
                "unaccounted": summary.get("env_step_books", {}).get("unaccounted"),
            }
        )
    )


if __name__ == "__main__":
    main()
