"""One env for the same minutes: our --algo (sac, td3 or ppo), Stable-Baselines3's same algorithm at RL Zoo's
settings for that env, and (after an off-policy pair) our --algo ppo, one after the other on this machine (or ours and
SB3's at the same time with --together: each about one core), each greedy-evaluated every 60 s of its training (10
episodes): the last evaluation of each, the ratio of ours to SB3's, and the evaluation curves in one picture.

  python perf/against_sb3.py                                   # HalfCheetah-v5, 15 minutes each: sac, SB3's sac, ppo
  python perf/against_sb3.py --minutes 2 --skip ppo --out /tmp/hc.png
  python perf/against_sb3.py --skip sb3,ppo -- --learner_threads 1   # flags after -- go to our first run
  python perf/against_sb3.py --algo td3 --skip ppo --together --out docs/halfcheetah_td3.png
  python perf/against_sb3.py --env BipedalWalker-v3 --algo ppo --out docs/bipedalwalker_ppo.png
  python perf/against_sb3.py --algo crossq --skip ppo   # against Stable-Baselines3-contrib's CrossQ (perf/'s venv)

Ours: train.py --env ENV --algo ALGO --train_for_seconds 60 x minutes --eval_every_sec 60 --eval_episodes 10 (the
evaluator is a process of the run: its time is counted; the env family's defaults); a curve point is each evaluation
line, at its seconds from launch. SB3: ../shared/baselines/sb3.sh --algo ALGO --env ENV --seconds 60 x minutes
--eval_every_sec 60 (RL Zoo's settings for the env where it has them, else SB3's defaults with the zoo's MuJoCo
learning_starts; its evaluation time not counted). Prints each run (stderr) and one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import EVAL_LINE, REPO, run_baseline  # noqa: E402

from sf_engine.envs.families import game_name  # noqa: E402


def run_ours(env: str, algo: str, minutes: float, extra: list) -> dict:
    """train.py in a new process: its evaluations [(seconds from launch, return)] and its summary's figures."""
    with tempfile.TemporaryDirectory(prefix="sf_engine_perf_") as train_dir:
        cmd = [sys.executable, os.path.join(REPO, "train.py"), "--train_dir", train_dir, "--experiment", "perf"]
        cmd += ["--env", env, "--algo", algo, "--train_for_seconds", str(60 * minutes), "--status_every_sec", "60"]
        cmd += ["--eval_every_sec", "60", "--eval_episodes", "10", *extra]
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
    if "replay_ratio" in summary:
        out |= {"replay_ratio": summary["replay_ratio"], "updates": summary["learner_samples"] // 256}
    return out


CONTRIB = ("crossq",)  # algorithms of Stable-Baselines3-contrib (perf/sb3_contrib.sh)


def run_sb3(env: str, algo: str, minutes: float) -> dict:
    """Stable-Baselines3's `algo` (the shared baseline), or for crossq Stable-Baselines3-contrib's (perf/'s, its own
    venv, two torch threads: this machine's cores)."""
    if algo in CONTRIB:
        cmd = [os.path.join(REPO, "perf", "sb3_contrib.sh"), "--algo", algo, "--env", env, "--threads", "2"]
        cmd += ["--eval_episodes", "10"]
    else:
        cmd = [os.path.join(REPO, "..", "shared", "baselines", "sb3.sh"), "--algo", algo, "--env", env]
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


def _pair(env: str, algo: str, minutes: float, extra: list, skip_sb3: bool, together: bool) -> dict:
    """Ours, then SB3's (unless skipped): one after the other, or at the same time."""
    from concurrent.futures import ThreadPoolExecutor

    runs = {}
    with ThreadPoolExecutor(2 if together else 1) as pool:
        mine = pool.submit(run_ours, env, algo, minutes, extra)
        if not together:
            runs[f"sf_engine {algo}"] = mine.result()
        theirs = None if skip_sb3 else pool.submit(run_sb3, env, algo, minutes)
        runs[f"sf_engine {algo}"] = mine.result()
        if theirs is not None:
            runs[f"Stable-Baselines3 {algo}"] = theirs.result()
    for label, run in runs.items():
        print(label, json.dumps(run), file=sys.stderr, flush=True)
    return runs


def draw(runs: dict, path: str, env: str, minutes: float, together: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, run in runs.items():
        points = run["evaluations"]
        ax.plot([s / 60 for s, _ in points], [v for _, v in points], marker="o", markersize=3, label=label)
    ax.set_xlabel("minutes from launch")
    ax.set_ylabel("greedy evaluation return (10 episodes)")
    how = "at the same time" if together else "each"
    ax.set_title(f"{env}, {minutes:g} minutes {how}, 2-core machine")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--minutes", type=float, default=15.0, help="training minutes of each run")
    parser.add_argument("--env", default="HalfCheetah-v5", help="a Gymnasium id both can make")
    parser.add_argument("--algo", default="sac", choices=("sac", "td3", "ppo", "crossq"), help="ours and theirs")
    parser.add_argument("--skip", default="", help="comma-separated runs to skip: sb3, ppo (our ppo after the pair)")
    parser.add_argument("--together", action="store_true", help="ours and SB3's at the same time (each ~1 core)")
    parser.add_argument("--out", default=None, help="the picture (default docs/ENV_ALGO.png, e.g. halfcheetah_sac.png)")
    args, extra = parser.parse_known_args()
    extra = [flag for flag in extra if flag != "--"]
    args.out = args.out or os.path.join(REPO, "docs", f"{game_name(args.env).lower()}_{args.algo}.png")
    skip, ours = set(filter(None, args.skip.split(","))), f"sf_engine {args.algo}"
    runs = _pair(args.env, args.algo, args.minutes, extra, "sb3" in skip, args.together)
    if "ppo" not in skip and args.algo != "ppo":
        runs["sf_engine ppo"] = run_ours(args.env, "ppo", args.minutes, [])
        print("ppo", json.dumps(runs["sf_engine ppo"]), file=sys.stderr, flush=True)
    result = {"env": args.env, "minutes": args.minutes, "algo": args.algo, "flags": extra, "together": args.together}
    result |= {label: {k: v for k, v in run.items() if k != "evaluations"} for label, run in runs.items()}
    sb3 = runs.get(f"Stable-Baselines3 {args.algo}")
    if sb3 and sb3["last_eval"] and runs[ours]["last_eval"] is not None:
        result["ratio_last_eval_vs_sb3"] = round(runs[ours]["last_eval"] / sb3["last_eval"], 2)
    draw(runs, args.out, args.env, args.minutes, args.together)
    result["picture"] = os.path.relpath(args.out, REPO)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
