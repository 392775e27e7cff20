"""Plot a TensorBoard scalar of one or more experiments against env steps (or minutes) as a PNG.

  python perf/plot_curve.py train_dir/breakout_30min --tag episode/return --out docs/breakout_return.png
  python perf/plot_curve.py train_dir/pong_f32 train_dir/pong_bf16 --labels float32,bf16 --out pong.png
  python perf/plot_curve.py train_dir/doom_basic SF_TRAIN_DIR/EXPERIMENT/.summary/0 --x minutes \
      --tag episode/return,reward/reward --labels sf_engine,"Sample Factory" --out doom_basic.png
With --x minutes, time counts from the run's launch where its config.json says when (the file each
engine writes at start, in the experiment folder or two folders up, as Sample Factory keeps it), else
from the first point. --tag takes one tag, or one per experiment (Sample Factory's return is
reward/reward).
--hline draws a reference value (a random policy's return, perf/random_return.py).
Needs matplotlib (pip install -e '.[perf]'). Prints one JSON line: per experiment the first, last and
largest value of the tag, its env steps and minutes.
"""

from __future__ import annotations

import argparse
import json
import os

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def launch_time(experiment_dir: str):
    """When the run started: the modification time of the config.json its engine writes at launch."""
    for folder in (experiment_dir, os.path.join(experiment_dir, os.pardir, os.pardir)):
        path = os.path.join(folder, "config.json")
        if os.path.isfile(path):
            return os.path.getmtime(path)
    return None


def read(experiment_dir: str, tag: str) -> list:
    events = EventAccumulator(experiment_dir, size_guidance={"scalars": 0})
    events.Reload()
    points = events.Scalars(tag) if tag in events.Tags().get("scalars", []) else []
    if not points:
        raise SystemExit(f"no {tag} scalars in {experiment_dir}")
    return points


def at_minute(values: list, minutes: list, minute: float):
    """The last value logged at or before `minute`."""
    before = [v for v, m in zip(values, minutes) if m <= minute]
    return before[-1] if before else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("experiment_dirs", nargs="+")
    parser.add_argument("--tag", default="episode/return", help="a scalar tag, or one per experiment, comma-separated")
    parser.add_argument("--labels", default=None, help="comma-separated, one per experiment (default: the names)")
    parser.add_argument("--x", choices=("env_steps", "minutes"), default="env_steps", help="the horizontal axis")
    parser.add_argument("--out", required=True, help="PNG path")
    parser.add_argument("--title", default=None)
    parser.add_argument(
        "--hline",
        type=float,
        default=None,
        help="a reference value drawn across the plot (e.g. a random policy's return from perf/random_return.py)",
    )
    parser.add_argument("--hline_label", default="reference", help="the legend's name of --hline")
    args = parser.parse_args()
    labels = (
        args.labels.split(",") if args.labels else [os.path.basename(os.path.normpath(d)) for d in args.experiment_dirs]
    )
    if len(labels) != len(args.experiment_dirs):
        parser.error(f"--labels: {len(labels)} labels for {len(args.experiment_dirs)} experiments")
    tags = args.tag.split(",")
    if len(tags) == 1:
        tags *= len(labels)
    if len(tags) != len(labels):
        parser.error(f"--tag: {len(tags)} tags for {len(args.experiment_dirs)} experiments")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    summary = []
    for experiment_dir, label, tag in zip(args.experiment_dirs, labels, tags):
        points = read(experiment_dir, tag)
        values = [p.value for p in points]
        start = (launch_time(experiment_dir) if args.x == "minutes" else None) or points[0].wall_time
        minutes = [(p.wall_time - start) / 60 for p in points]
        ax.plot(
            [p.step for p in points] if args.x == "env_steps" else minutes,
            values,
            lw=1.5,
            label=f"{label} ({minutes[-1]:.0f} min)" if args.x == "env_steps" else label,
        )
        summary.append(
            {
                "experiment": label,
                "points": len(values),
                "first": values[0],
                "last": values[-1],
                "max": max(values),
                "minutes": round(minutes[-1], 1),
                "env_steps": points[-1].step,
                "at_minute": {m: at_minute(values, minutes, m) for m in (5, 10, 20) if minutes[-1] >= m},
            }
        )
    if args.hline is not None:
        ax.axhline(args.hline, color="gray", ls="--", lw=1.2, label=f"{args.hline_label} ({args.hline:.2f})")
    ax.set_xlabel("env steps" if args.x == "env_steps" else "minutes of training")
    ax.set_ylabel(tags[0] if len(set(tags)) == 1 else "episode return")
    ax.set_title(args.title or ", ".join(labels))
    ax.grid(alpha=0.3)
    if len(labels) > 1 or args.hline is not None:
        ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out)
    print(json.dumps({"tag": args.tag, "runs": summary}))


if __name__ == "__main__":
    main()
