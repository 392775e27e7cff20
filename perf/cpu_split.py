"""Where a run's CPU goes: the CPU time of each role's process (and of the processes its envs run in,
VizDoom's games say) over a window of a real run, per env step and as cores busy.

  python perf/cpu_split.py -- --env doom_basic --num_workers 2 --num_envs_per_worker 32 --sampling_only true
  python perf/cpu_split.py --warmup 30 --window 20 -- --env doom_basic --bf16 true
Flags after -- go to train.py (in a temporary train_dir). The roles come from the run's processes.json;
each rollout worker's child processes count as 'env_processes'. Prints one JSON line: env steps/s in
the window, per role the cores it kept busy and its CPU microseconds per env step, and the cores left
idle.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_seconds(pids: dict) -> dict:
    """{role: CPU seconds} of the processes in {role: [psutil.Process]}, rollout workers' children as
    'env_processes' (a process gone meanwhile counts 0)."""
    import psutil

    totals = {}
    for role, processes in pids.items():
        for process in processes:
            for name, proc in [(role, process)] + [("env_processes", c) for c in _children(process, role)]:
                try:
                    times = proc.cpu_times()
                    totals[name] = totals.get(name, 0.0) + times.user + times.system
                except psutil.Error:
                    pass
    return totals


def _children(process, role: str) -> list:
    import psutil

    try:
        return process.children(recursive=True) if role == "rollout_worker" else []
    except psutil.Error:
        return []


def env_steps(log_path: str) -> int:
    """The env steps the run's last status line counted (train.log)."""
    steps = 0
    with open(log_path) as f:
        for line in f:
            if "env steps " in line:
                steps = int(line.split("env steps ")[1].split(" ")[0].replace(",", ""))
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--warmup", type=float, default=20.0, help="Seconds after launch before the window.")
    parser.add_argument("--window", type=float, default=15.0, help="Seconds measured.")
    parser.add_argument("flags", nargs="*", help="train.py flags (after --)")
    args = parser.parse_args()
    import psutil

    with tempfile.TemporaryDirectory(prefix="sf_engine_cpu_split_") as train_dir:
        run_seconds = args.warmup + args.window + 10
        cmd = [
            sys.executable,
            os.path.join(REPO, "train.py"),
            "--train_dir",
            train_dir,
            "--experiment",
            "split",
            "--status_every_sec",
            "1",
            "--train_for_seconds",
            str(run_seconds),
        ] + args.flags
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        experiment = os.path.join(train_dir, "split")
        time.sleep(args.warmup)
        with open(os.path.join(experiment, "processes.json")) as f:
            roles = {}
            for entry in json.load(f)["processes"]:
                roles.setdefault(entry["role"], []).append(psutil.Process(entry["pid"]))
        log = os.path.join(experiment, "train.log")
        before, steps_before, start = cpu_seconds(roles), env_steps(log), time.monotonic()
        time.sleep(args.window)
        after, steps_after, elapsed = cpu_seconds(roles), env_steps(log), time.monotonic() - start
        _, err = proc.communicate(timeout=run_seconds + 300)
        if proc.returncode != 0:
            raise SystemExit(f"train.py exited with {proc.returncode}: {err[-2000:]}")
    steps = max(steps_after - steps_before, 1)
    busy = {role: (after[role] - before.get(role, 0.0)) for role in after}
    cores = len(os.sched_getaffinity(0))
    print(
        json.dumps(
            {
                "bench": "cpu_split",
                "flags": args.flags,
                "window_sec": round(elapsed, 1),
                "env_steps_per_sec": round(steps / elapsed),
                "cores_busy": {role: round(sec / elapsed, 2) for role, sec in sorted(busy.items())},
                "cpu_us_per_env_step": {role: round(sec / steps * 1e6) for role, sec in sorted(busy.items())},
                "cores_idle": round(cores - sum(busy.values()) / elapsed, 2),
                "cores": cores,
            }
        )
    )


if __name__ == "__main__":
    main()
