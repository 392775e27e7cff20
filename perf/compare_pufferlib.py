"""Side by side on this machine: sf_engine on CartPole-v1 vs PufferLib 3 on its own C CartPole, both
training on the CPU, interleaved.

  python perf/compare_pufferlib.py --seconds 30 --rounds 2

Each round (the order of the two libraries alternates between rounds) runs, for --seconds each:
  ours at its defaults, ours with one epoch (--num_epochs 1: PufferLib's default is one epoch too, so
  its default run is the equal-reuse run as well), ours with --rnn lstm, PufferLib with its MLP
  policy (--no-rnn) and PufferLib's stock config (LSTM); plus ours until the mean return reaches 475
  (seconds from launch). PufferLib runs through ../shared/baselines/pufferlib.sh (--baselines_dir).

Throughput is env steps over the whole training run, start-up excluded on both sides (ours:
env_steps / wall_sec of summary.json, from the run's start; PufferLib: its global step / the seconds
since its trainer was built). The return at equal wall time is each one's mean episode return at the
end of its --seconds run (ours: the last 100 episodes of CartPole-v1, which caps episodes at 500
steps; PufferLib's CartPole caps them at 200). One JSON line last: the medians over the rounds, every
run, and the ratios ours / PufferLib.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, run_baseline, run_train  # noqa: E402

OURS = {"defaults": [], "one_epoch": ["--num_epochs", "1"], "lstm": ["--rnn", "lstm"]}
THEIRS = {"mlp": ["--no-rnn"], "lstm": []}
# (our run, their run) compared: each at its defaults, at equal sample reuse, recurrent
RATIOS = {"defaults": ("defaults", "mlp"), "equal_reuse": ("one_epoch", "mlp"), "lstm": ("lstm", "lstm")}


def ours(name: str, seconds: float) -> dict:
    summary = run_train(
        ["--train_for_seconds", str(seconds), "--train_for_env_steps", str(10**12)] + OURS[name], seconds + 180
    )
    return {
        "env_steps_per_sec": round(summary["env_steps"] / summary["wall_sec"]),
        "return": summary["episode_return_mean"],
        "bottleneck": summary["bottleneck"],
        "workers_x_envs": f"{summary['num_workers']}x{summary['num_envs_per_worker']}",
    }


def theirs(name: str, seconds: float, script: str) -> dict:
    result = run_baseline(["bash", script, "--seconds", str(seconds)] + THEIRS[name], seconds + 900)
    return {
        "env_steps_per_sec": round(result["env_steps_per_sec"]),
        "return": result["episode_return_mean"],
        "policy": result.get("policy"),
        "batch_size": result.get("batch_size"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="Training time of each run.")
    parser.add_argument("--rounds", type=int, default=2, help="Rounds (>= 1); the order alternates.")
    parser.add_argument("--baselines_dir", default=os.path.join(os.path.dirname(REPO), "shared", "baselines"))
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1 (got {args.rounds})")
    script = os.path.join(args.baselines_dir, "pufferlib.sh")
    if not os.path.isfile(script):
        parser.error(f"--baselines_dir {args.baselines_dir}: no pufferlib.sh there")
    runs = {f"ours_{name}": [] for name in OURS} | {f"pufferlib_{name}": [] for name in THEIRS}
    runs["ours_solve_sec_from_launch"] = []

    def measure_ours():
        for name in OURS:
            runs[f"ours_{name}"].append(ours(name, args.seconds))
            print(f"ours {name}: {runs[f'ours_{name}'][-1]}", file=sys.stderr, flush=True)
        solve = run_train(["--stop_at_return", "475", "--train_for_seconds", "60"], 240)
        runs["ours_solve_sec_from_launch"].append(
            solve["launch_to_exit_sec"] if solve["episode_return_mean"] >= 475 else None
        )
        print(f"ours to 475: {runs['ours_solve_sec_from_launch'][-1]} s", file=sys.stderr, flush=True)

    def measure_theirs():
        for name in THEIRS:
            runs[f"pufferlib_{name}"].append(theirs(name, args.seconds, script))
            print(f"pufferlib {name}: {runs[f'pufferlib_{name}'][-1]}", file=sys.stderr, flush=True)

    for round_index in range(args.rounds):
        for measure in (measure_ours, measure_theirs) if round_index % 2 == 0 else (measure_theirs, measure_ours):
            measure()
    out = {"bench": "compare_pufferlib", "seconds": args.seconds, "rounds": args.rounds, "cpus": os.cpu_count()}
    median = lambda key, field: statistics.median(r[field] for r in runs[key] if r[field] is not None)  # noqa: E731
    for key in runs:
        if key != "ours_solve_sec_from_launch":
            out[f"{key}_env_steps_per_sec"] = round(median(key, "env_steps_per_sec"))
            out[f"{key}_return"] = median(key, "return")
    solved = [s for s in runs["ours_solve_sec_from_launch"] if s is not None]
    out["ours_solve_sec_from_launch"] = statistics.median(solved) if solved else None
    for label, (mine, their) in RATIOS.items():
        out[f"ratio_{label}"] = round(
            out[f"ours_{mine}_env_steps_per_sec"] / out[f"pufferlib_{their}_env_steps_per_sec"], 2
        )
        out[f"ratio_{label}_rounds"] = [
            round(a["env_steps_per_sec"] / b["env_steps_per_sec"], 2)
            for a, b in zip(runs[f"ours_{mine}"], runs[f"pufferlib_{their}"])
        ]
    out["runs"] = runs
    print(json.dumps(out))


if __name__ == "__main__":
    main()
