"""Throughput over a grid of num_workers x num_envs_per_worker x worker_num_splits.

  python perf/scaling.py --env CartPole-v1 --workers 1,2,3 --envs 32,128,512 --splits 1,2 --seconds 8
  python perf/scaling.py --train --workers 1,2,3 --envs 64,128,256 --splits 2
Each point is a run of train.py (median of its 2-s windows after warm-up): sampling only by default,
with `--train` full training with the env family's learning defaults (then envs per split must divide
the training batch in slots). Prints the table, writes a PNG (needs matplotlib: pip install -e '.[perf]')
and one JSON line last with every point, each with the bottleneck the run reported.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import median_windows, run_train  # noqa: E402


def ints(text: str) -> list:
    return [int(x) for x in text.split(",")]


def plot(points: list, env: str, path: str, train: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for (workers, splits), group in itertools.groupby(
        sorted(points, key=lambda p: (p["num_workers"], p["splits"], p["num_envs_per_worker"])),
        key=lambda p: (p["num_workers"], p["splits"]),
    ):
        group = list(group)
        ax.plot(
            [p["num_envs_per_worker"] for p in group],
            [p["env_steps_per_sec"] for p in group],
            marker="o",
            label=f"{workers} workers, {splits} splits",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("envs per worker")
    ax.set_ylabel(f"env steps/s ({'training' if train else 'sampling only'})")
    ax.set_title(f"{env}: {'training' if train else 'sampling'} throughput on {os.cpu_count()} cores")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--workers", type=ints, default=[1, 2, 3])
    parser.add_argument("--envs", type=ints, default=[32, 128, 512])
    parser.add_argument("--splits", type=ints, default=[1, 2])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--train", action="store_true", help="full training runs instead of sampling only")
    parser.add_argument("--png", default="scaling.png")
    args = parser.parse_args()
    points = []
    for workers, envs, splits in itertools.product(args.workers, args.envs, args.splits):
        if envs % splits:
            continue
        flags = [
            "--env",
            args.env,
            "--num_workers",
            str(workers),
            "--num_envs_per_worker",
            str(envs),
            "--worker_num_splits",
            str(splits),
            "--train_for_seconds",
            str(args.seconds + 5),
        ]
        if not args.train:  # one slot per batch: any grid point validates
            flags += [
                "--sampling_only",
                "true",
                "--rollout",
                "32",
                "--batch_size",
                str(32 * (envs // splits)),
                "--num_batches_per_epoch",
                "1",
            ]
        summary = run_train(flags, args.seconds + 180)
        point = {
            "num_workers": workers,
            "num_envs_per_worker": envs,
            "splits": splits,
            "env_steps_per_sec": round(median_windows([summary])),
            "bottleneck": summary.get("bottleneck"),
        }
        points.append(point)
        print(
            f"{workers} workers x {envs:4d} envs, {splits} splits: {point['env_steps_per_sec']:>10,} env steps/s, "
            f"{point['bottleneck']}",
            file=sys.stderr,
            flush=True,
        )
    try:
        plot(points, args.env, args.png, args.train)
    except ImportError:
        print("matplotlib is not installed: no PNG (pip install -e '.[perf]')", file=sys.stderr)
    best = max(points, key=lambda p: p["env_steps_per_sec"])
    print(
        json.dumps(
            {
                "bench": "scaling",
                "env": args.env,
                "training": args.train,
                "points": points,
                "best": best,
                "png": args.png,
            }
        )
    )


if __name__ == "__main__":
    main()
