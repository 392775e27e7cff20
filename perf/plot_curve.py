"""Plot a TensorBoard scalar of an experiment against env steps (and wall time) as a PNG.

  python perf/plot_curve.py train_dir/breakout_30min --tag episode/return --out docs/breakout_return.png
Needs matplotlib (pip install -e '.[perf]'). Prints one JSON line: first/last/max value of the tag.
"""
from __future__ import annotations

import argparse
import json
import os

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment_dir")
    parser.add_argument("--tag", default="episode/return")
    parser.add_argument("--out", required=True, help="PNG path")
    parser.add_argument("--title", default=None)
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = EventAccumulator(args.experiment_dir, size_guidance={"scalars": 0})
    events.Reload()
    points = events.Scalars(args.tag)
    if not points:
        raise SystemExit(f"no {args.tag} scalars in {args.experiment_dir}")
    steps = [p.step for p in points]
    values = [p.value for p in points]
    minutes = [(p.wall_time - points[0].wall_time) / 60 for p in points]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(steps, values, lw=1.5)
    ax.set_xlabel(f"env steps ({minutes[-1]:.0f} minutes of wall-clock time)")
    ax.set_ylabel(args.tag)
    ax.set_title(args.title or os.path.basename(os.path.normpath(args.experiment_dir)))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out)
    print(json.dumps({"tag": args.tag, "points": len(values), "first": values[0], "last": values[-1],
                      "max": max(values), "minutes": round(minutes[-1], 1), "env_steps": steps[-1]}))


if __name__ == "__main__":
    main()
