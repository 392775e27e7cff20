"""Instructions per env step of a whole training run, counted by valgrind's callgrind: a figure the machine's noise
does not move (the same binary and inputs give the same count, whatever else runs), for telling whether a change
costs the CPU more work where seconds on a shared VM cannot resolve a few percent.

  python perf/instructions_per_step.py                                         # this checkout
  python perf/instructions_per_step.py --other ../previous --other_python ../previous/.venv/bin/python
  python perf/instructions_per_step.py --steps 32768,131072 -- --algo dqn      # flags after -- go to train.py

Each checkout runs train.py --mode serial --deterministic true (every role in one process, one thread: the same
work every time) on CartPole-v1 with the sizes pinned (1 worker x 512 envs, rollout 16) under callgrind, for two
--train_for_env_steps budgets; the difference of the two counts over the difference of the env steps is the work of
one env step of training, acting and stepping, start-up excluded. Slow: about 8 s per thousand env steps under
callgrind (runs of 32,768 and 262,144 env steps took 4 and 34 minutes). Prints one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PINNED = ["--num_workers", "1", "--num_envs_per_worker", "512", "--rollout", "16"]


def instructions(repo: str, python: str, env_steps: int, flags: list) -> int:
    """Instructions callgrind counted over a serial run of `env_steps` of `repo`'s train.py."""
    with tempfile.TemporaryDirectory(prefix="sf_engine_callgrind_") as work:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={os.path.join(work, 'out')}", python]
        cmd += [os.path.join(repo, "train.py"), "--train_dir", work, "--experiment", "count", "--mode", "serial"]
        cmd += ["--deterministic", "true", "--train_for_env_steps", str(env_steps), "--status_every_sec", "1000"]
        cmd += PINNED + flags
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": repo}
        proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, env=env)
        found = re.search(r"Collected : (\d+)", proc.stderr)
        if proc.returncode != 0 or not found:
            raise SystemExit(f"train.py under callgrind failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return int(found.group(1))


def per_step(repo: str, python: str, steps: list, flags: list) -> dict:
    counts = [instructions(repo, python, n, flags) for n in steps]
    out = {"instructions": dict(zip(map(str, steps), counts))}
    out["per_env_step"] = round((counts[1] - counts[0]) / (steps[1] - steps[0]), 1)
    print(repo, json.dumps(out), file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--steps", default="32768,262144", help="the two env-step budgets, comma-separated")
    parser.add_argument("--other", default=None, help="another checkout, counted the same way")
    parser.add_argument("--other_python", default=sys.executable, help="the Python of the other checkout's venv")
    args, flags = parser.parse_known_args()
    flags = [flag for flag in flags if flag != "--"]
    steps = sorted(int(n) for n in args.steps.split(","))
    if len(steps) != 2 or steps[0] == steps[1]:
        parser.error("--steps takes two different budgets, such as 32768,262144")
    result = {"env": "CartPole-v1", "mode": "serial", "flags": PINNED + flags, "steps": steps}
    result["this"] = per_step(REPO, sys.executable, steps, flags)
    if args.other:
        result["other"] = per_step(os.path.abspath(args.other), args.other_python, steps, flags)
        result["ratio_this_to_other"] = round(result["this"]["per_env_step"] / result["other"]["per_env_step"], 4)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
