"""Helpers shared by the perf/ scripts: run train.py in a fresh process and read what it measured."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the line the terminal and train.log print for each greedy evaluation: its version and mean return
EVAL_LINE = re.compile(r"evaluation of version (\d+): return (-?[\d.]+)")


def run_train(flags: list, timeout_sec: float, repo: str = REPO, python: str = sys.executable, inspect=None) -> dict:
    """Run `train.py flags` of the checkout `repo` with `python` in a new process (start-up included, as a
    user sees it) in a temporary train_dir; returns its summary.json plus `launch_to_exit_sec`.
    `inspect(train_dir, experiment)`, when given, is called after the run, before the train_dir goes."""
    with tempfile.TemporaryDirectory(prefix="sf_engine_perf_") as train_dir:
        cmd = [
            python,
            os.path.join(repo, "train.py"),
            "--train_dir",
            train_dir,
            "--experiment",
            "perf",
            "--status_every_sec",
            "1000",
        ] + flags
        start = time.monotonic()
        # that checkout's sf_engine in every process of the run, before what the caller's path holds (its packages)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
        proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=timeout_sec, env=env)
        elapsed = time.monotonic() - start
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
            raise SystemExit(f"train.py exited with {proc.returncode}: {' '.join(flags)}")
        with open(os.path.join(train_dir, "perf", "summary.json")) as f:
            summary = json.load(f)
        if inspect is not None:
            inspect(train_dir, "perf")
    summary["launch_to_exit_sec"] = round(elapsed, 2)
    return summary


def read_json(path: str) -> dict:
    """A JSON file a run writes (summary.json, processes.json), or {} where it is not there (yet) or half-written."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def learner_pid(exp_dir: str):
    """The pid of a running experiment's learner process (its processes.json), or None."""
    rows = read_json(os.path.join(exp_dir, "processes.json")).get("processes", [])
    return next((row["pid"] for row in rows if row.get("role") == "learner"), None)


def median_windows(summaries: list) -> float:
    windows = [w for s in summaries for w in s["env_steps_per_sec_windows"]]
    return statistics.median(windows) if windows else statistics.median(s["env_steps_per_sec"] for s in summaries)


def held_share(evaluations: list, threshold: float, window_sec: float | None = None):
    """How well a run holds what it reached: of its evaluations (seconds, version, return) after the first whose
    return is at or above `threshold`, and at most `window_sec` after it (None: all after it), the share at or above
    `threshold`; None where none reached it or none came after."""
    first = next((i for i, (_, _, ret) in enumerate(evaluations) if ret >= threshold), None)
    if first is None:
        return None
    reached = evaluations[first][0]
    after = [ret for sec, _, ret in evaluations[first + 1 :] if window_sec is None or sec - reached <= window_sec]
    return round(sum(ret >= threshold for ret in after) / len(after), 3) if after else None


def run_baseline(cmd: list, timeout_sec: float) -> dict:
    """Run a baseline command that prints one JSON line last; returns that line parsed, plus
    `launch_to_exit_sec`."""
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_sec)
    elapsed = time.monotonic() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"baseline failed: {' '.join(cmd)}")
    return {**json.loads(lines[-1]), "launch_to_exit_sec": round(elapsed, 2)}


def play_match(
    train_dir: str, experiment: str, checkpoint: str, opponent: str, games: int, deterministic: bool
) -> dict:
    """enjoy.py of `checkpoint` (of run `experiment` under `train_dir`) against `opponent` for `games` games, both
    seats: the match's figures (the ratings where the game reports them)."""
    cmd = [sys.executable, os.path.join(REPO, "enjoy.py"), "--train_dir", train_dir, "--experiment", experiment]
    cmd += ["--checkpoint", checkpoint, "--opponent", opponent, "--num_episodes", str(games)]
    figures = run_baseline(cmd + (["--deterministic"] if deterministic else []), timeout_sec=1800)
    keys = ("games", "win_rate", "draw_rate", "loss_rate", "games_per_seat", "rating_mu", "opponent_rating_mu")
    return {key: figures[key] for key in keys if key in figures}
