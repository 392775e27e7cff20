"""Plot a TensorBoard scalar of one or more experiments against env steps (or minutes) as a PNG.

  python perf/plot_curve.py train_dir/breakout_30min --tag episode/return --out docs/breakout_return.png
  python perf/plot_curve.py train_dir/pong_f32 train_dir/pong_bf16 --labels float32,bf16 --out pong.png
Needs matplotlib (pip install -e '.[perf]'). Prints one JSON line: per experiment the first, last and
largest value of the tag, its env steps and minutes.
"""
from __future__ import annotations

import argparse
import json
import os

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def read(experiment_dir: str, tag: str) -> list:
    events = EventAccumulator(experiment_dir, size_guidance={"scalars": 0})
    events.Reload()
    points = events.Scalars(tag) if tag in events.Tags().get("scalars", []) else []
    if not points:
        raise SystemExit(f"no {tag} scalars in {experiment_dir}")
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment_dirs", nargs="+")
    parser.add_argument("--tag", default="episode/return")
    parser.add_argument("--labels", default=None, help="comma-separated, one per experiment (default: the names)")
    parser.add_argument("--x", choices=("env_steps", "minutes"), default="env_steps", help="the horizontal axis")
    parser.add_argument("--out", required=True, help="PNG path")
    parser.add_argument("--title", default=None)
    args = parser.parse_args()
    labels = args.labels.split(",") if args.labels else [os.path.basename(os.path.normpath(d)) for d in
                                                             args.experiment_dirs]
    if len(labels) != len(args.experiment_dirs):
        parser.error(f"--labels: {len(labels)} labels for {len(args.experiment_dirs)} experiments")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    summary = []
    for experiment_dir, label in zip(args.experiment_dirs, labels):
        points = read(experiment_dir, args.tag)
        values = [p.value for p in points]
        minutes = [(p.wall_time - points[0].wall_time) / 60 for p in points]
        ax.plot([p.step for p in points] if args.x == "env_steps" else minutes, values, lw=1.5,
                label=f"{label} ({minutes[-1]:.0f} min)" if args.x == "env_steps" else label)
        summary.append({"experiment": label, "points": len(values), "first": values[0], "last": values[-1],
                        "max": max(values), "minutes": round(minutes[-1], 1), "env_steps": points[-1].step})
    ax.set_xlabel("env steps" if args.x == "env_steps" else "minutes of training")
    ax.set_ylabel(args.tag)
    ax.set_title(args.title or ", ".join(labels))
    ax.grid(alpha=0.3)
    if len(labels) > 1:
        ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out)
    print(json.dumps({"tag": args.tag, "runs": summary}))


if __name__ == "__main__":
    main()
