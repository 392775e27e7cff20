"""HalfCheetah-v5 for the same minutes: our --algo sac, Stable-Baselines3's SAC and our --algo ppo, one after the
other on this machine, each greedy-evaluated every 60 s of its training (10 episodes): the last evaluation of each,
the ratio of ours to SB3's, and the three evaluation curves in one picture.

  python perf/sac_halfcheetah.py                                   # 15 minutes each: sac, SB3's sac, ppo
  python perf/sac_halfcheetah.py --minutes 2 --skip ppo --out /tmp/hc.png
  python perf/sac_halfcheetah.py --skip sb3,ppo -- --learner_threads 1   # flags after -- go to our sac run

Ours: train.py --env HalfCheetah-v5 --algo sac|ppo --train_for_seconds 60 x minutes --eval_every_sec 60
--eval_episodes 10 (the evaluator is a process of the run: its time is counted); a curve point is each evaluation
line, at its seconds from launch. SB3: ../shared/baselines/sb3.sh --algo sac --env HalfCheetah-v5 --seconds
60 x minutes --eval_every_sec 60 (its MuJoCo defaults: one env, one update per env step; its evaluation time not
counted). Prints each run (stderr) and one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, run_baseline  # noqa: E402

EVAL_LINE = re.compile(r"evaluation of version (\d+): return (-?[\d.]+)")
ENV = "HalfCheetah-v5"


def run_ours(algo: str, minutes: float, extra: list) -> dict:
    """train.py in a new process: its evaluations [(seconds from launch, return)] and its summary's figures."""
    with tempfile.TemporaryDirectory(prefix="sf_engine_perf_") as train_dir:
        cmd = [sys.executable, os.path.join(REPO, "train.py"), "--train_dir", train_dir, "--experiment", "perf"]
        cmd += ["--env", ENV, "--algo", algo, "--train_for_seconds", str(60 * minutes), "--status_every_sec", "60"]
        cmd += ["--eval_every_sec", "60", "--eval_episodes", "10", *(extra if algo == "sac" else [])]
        start, evaluations = time.monotonic(), []
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            found = EVAL_LINE.search(line)
            if found:
                evaluations.append([round(time.monotonic() - start, 1), float(found.group(2))])
        if proc.wait():
            raise SystemExit(f"train.py --algo {algo} exited with {proc.returncode}")
        with open(os.path.join(train_dir, "perf", "summary.json")) as f:
            summary = json.load(f)
    keys = ("env_steps", "env_steps_per_sec", "num_workers", "num_envs_per_worker", "episode_return_mean")
    out = {key: summary[key] for key in keys} | {"evaluations": evaluations}
    out["last_eval"] = evaluations[-1][1] if evaluations else None
    if algo == "sac":
        out |= {"replay_ratio": summary["replay_ratio"], "updates": summary["learner_samples"] // 256}
    return out


def run_sb3(minutes: float) -> dict:
    cmd = [os.path.join(REPO, "..", "shared", "baselines", "sb3.sh"), "--algo", "sac", "--env", ENV]
    cmd += ["--seconds", str(60 * minutes), "--eval_every_sec", "60"]
    out = run_baseline(cmd, timeout_sec=60 * minutes + 900)
    evaluations = [[seconds, value] for seconds, _, value in out.get("evals", [])]
    return {
        "env_steps": out["env_steps"],
        "gradient_steps": out.get("gradient_steps"),
        "episode_return_mean": out["episode_return_mean"],
        "evaluations": evaluations,
        "last_eval": evaluations[-1][1] if evaluations else None,
    }


def draw(runs: dict, path: str, minutes: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, run in runs.items():
        points = run["evaluations"]
        ax.plot([s / 60 for s, _ in points], [v for _, v in points], marker="o", markersize=3, label=label)
    ax.set_xlabel("minutes from launch")
    ax.set_ylabel("greedy evaluation return (10 episodes)")
    ax.set_title(f"{ENV}, {minutes:g} minutes each, 2-core machine")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--minutes", type=float, default=15.0, help="training minutes of each run")
    parser.add_argument("--skip", default="", help="comma-separated runs to skip: sb3, ppo")
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "halfcheetah_sac_ppo.png"))
    args, extra = parser.parse_known_args()
    extra = [flag for flag in extra if flag != "--"]
    skip = set(filter(None, args.skip.split(",")))
    runs = {"sf_engine sac": run_ours("sac", args.minutes, extra)}
    print("sac", json.dumps(runs["sf_engine sac"]), file=sys.stderr, flush=True)
    if "sb3" not in skip:
        runs["Stable-Baselines3 sac"] = run_sb3(args.minutes)
        print("sb3", json.dumps(runs["Stable-Baselines3 sac"]), file=sys.stderr, flush=True)
    if "ppo" not in skip:
        runs["sf_engine ppo"] = run_ours("ppo", args.minutes, [])
        print("ppo", json.dumps(runs["sf_engine ppo"]), file=sys.stderr, flush=True)
    result = {"env": ENV, "minutes": args.minutes, "sac_flags": extra}
    result |= {label: {k: v for k, v in run.items() if k != "evaluations"} for label, run in runs.items()}
    sb3 = runs.get("Stable-Baselines3 sac")
    if sb3 and sb3["last_eval"] and runs["sf_engine sac"]["last_eval"] is not None:
        result["ratio_last_eval_vs_sb3"] = round(runs["sf_engine sac"]["last_eval"] / sb3["last_eval"], 2)
    draw(runs, args.out, args.minutes)
    result["picture"] = os.path.relpath(args.out, REPO)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
