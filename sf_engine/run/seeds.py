"""One experiment over many seeds, and the figures a paper reports of it: each seed's curve, their interquartile
mean (IQM) and its 95% stratified-bootstrap interval (sf_engine.stats.aggregate), and a plot.

  python -m sf_engine.run.seeds --seeds 10 --experiment cartpole -- --env CartPole-v1 --train_for_env_steps 300000
Runs train.py's flags (after --) once per seed, as experiments EXPERIMENT_seed<k> with --seed k, --parallel at a
time (one by default: each run sizes itself for the whole machine); a seed whose experiment already holds its budget
is not trained again, so the command can be run again after a stop. Then reads each run's TensorBoard scalar --tag
against env steps, takes it at --points env steps common to every run, and writes EXPERIMENT_seeds.json (and
EXPERIMENT_seeds.png, with matplotlib) beside the runs; prints its final figures as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

from sf_engine.config.checks import check_flags
from sf_engine.config.cli import make_config, parse_flags
from sf_engine.config.fields import ConfigError
from sf_engine.stats.aggregate import bootstrap_interval, iqm

RUNNER = "sf_engine.run.runner"  # train.py's entry, run as `python -m`
OWN_FLAGS = ("--seed", "--experiment")  # the seed runner sets them for each run


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--seeds", type=int, default=10, help="Runs, one per seed (at least 2).")
    parser.add_argument("--first_seed", type=int, default=0, help="The seed of the first run; the others follow.")
    parser.add_argument("--experiment", default="seeds", help="Name of the runs (EXPERIMENT_seed<k>) and figures.")
    parser.add_argument("--parallel", type=int, default=1, help="Runs at a time (each sizes itself for the machine).")
    parser.add_argument("--tag", default="episode/return", help="The TensorBoard scalar whose curves are compared.")
    parser.add_argument("--points", type=int, default=50, help="Env-step points of the curves (at least 2).")
    parser.add_argument("--reps", type=int, default=50_000, help="Bootstrap replicates of the interval.")
    parser.add_argument("train_flags", nargs=argparse.REMAINDER, help="-- then train.py's flags for every run.")
    args = parser.parse_args(argv)
    args.train_flags = args.train_flags[1:] if args.train_flags[:1] == ["--"] else args.train_flags
    if args.seeds < 2 or args.parallel < 1 or args.points < 2 or args.reps < 100:
        parser.error("--seeds and --points must be at least 2, --parallel at least 1 and --reps at least 100")
    taken = [flag for flag in args.train_flags if flag.split("=")[0] in OWN_FLAGS]
    if taken:
        parser.error(f"{taken[0]}: the seed runner sets --seed and --experiment of each run; drop it from the flags")
    return args


def train_dir_of(train_flags: list) -> str:
    """The runs' --train_dir, from the flags, once they pass train.py's checks of the flags alone (ConfigError of
    one line otherwise; what needs the env, each run checks: the first one's error stops the others)."""
    cfg = make_config(parse_flags(list(train_flags)))
    check_flags(cfg)
    return cfg.run.train_dir


def run_seeds(args, train_dir: str) -> list:
    """Train every seed, --parallel at a time; returns the experiments' folders. A failed run stops the rest."""
    names = [f"{args.experiment}_seed{seed}" for seed in range(args.first_seed, args.first_seed + args.seeds)]
    pending = list(zip(range(args.first_seed, args.first_seed + args.seeds), names))
    running: list = []
    while pending or running:
        while pending and len(running) < args.parallel:
            seed, name = pending.pop(0)
            cmd = [sys.executable, "-m", RUNNER, *args.train_flags, "--seed", str(seed), "--experiment", name]
            print(f"seed {seed}: {' '.join(cmd[3:])}", flush=True)
            running.append((name, subprocess.Popen(cmd, stdout=subprocess.DEVNULL)))
        name, process = running.pop(0)
        if process.wait() != 0:
            for _, other in running:
                other.terminate()
                other.wait()
            raise SystemExit(f"error: the run {name} exited with {process.returncode} (its train.log says why)")
    return [os.path.join(train_dir, name) for name in names]


def read_curve(experiment_dir: str, tag: str) -> tuple:
    """(env steps, values) of a TensorBoard scalar of a run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(experiment_dir, size_guidance={"scalars": 0})
    events.Reload()
    if tag not in events.Tags()["scalars"]:
        raise SystemExit(f"error: {experiment_dir} has no scalar {tag!r}: give --tag one of its scalars")
    return curve_of([(p.wall_time, p.step, p.value) for p in events.Scalars(tag)])


def curve_of(points: list) -> tuple:
    """(env steps, values) of (wall time, step, value) points as they were written: a run resumed from an older
    checkpoint steps back, and its points from there on replace those its previous run wrote beyond it."""
    kept: list = []
    for _, step, value in sorted(points):
        while kept and kept[-1][0] >= step:
            kept.pop()
        kept.append((step, value))
    return np.array([k[0] for k in kept], np.float64), np.array([k[1] for k in kept], np.float64)


def figures_of(curves: list, points: int, reps: int, seed: int = 0) -> dict:
    """The curves (env steps, values) taken at `points` env steps every run reached (from the latest first point to
    the earliest last one), their IQM and 95% interval at each, and at the last point: the final figures."""
    start, end = max(steps[0] for steps, _ in curves), min(steps[-1] for steps, _ in curves)
    grid = np.linspace(start, end, points)
    scores = np.stack([np.interp(grid, steps, values) for steps, values in curves])[:, None, :]  # [runs, 1, points]
    interval = bootstrap_interval(scores, iqm, 0.95, reps, np.random.default_rng(seed))
    final = scores[:, :, -1]
    return {
        "env_steps": grid.round().tolist(),
        "curves": scores[:, 0].tolist(),
        "iqm": iqm(scores).tolist(),
        "interval": interval.tolist(),
        "final_scores": final[:, 0].tolist(),
        "final_iqm": float(iqm(final)),
        "final_interval": bootstrap_interval(final, iqm, 0.95, reps, np.random.default_rng(seed)).tolist(),
    }


def plot(figures: dict, tag: str, path: str) -> bool:
    """Each seed's curve, their IQM and its interval, as a PNG; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    steps = np.array(figures["env_steps"])
    fig, ax = plt.subplots(figsize=(7, 4))
    for curve in figures["curves"]:
        ax.plot(steps, curve, color="grey", alpha=0.35, linewidth=0.8)
    ax.fill_between(steps, *figures["interval"], alpha=0.3, label="95% stratified bootstrap interval")
    ax.plot(steps, figures["iqm"], linewidth=2, label=f"IQM of {len(figures['curves'])} seeds")
    ax.set_xlabel("env steps")
    ax.set_ylabel(tag)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        train_dir = train_dir_of(args.train_flags)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    experiments = run_seeds(args, train_dir)
    curves = [read_curve(folder, args.tag) for folder in experiments]
    figures = {"tag": args.tag, "experiments": [os.path.basename(e) for e in experiments]}
    figures |= figures_of(curves, args.points, args.reps)
    out = os.path.join(train_dir, f"{args.experiment}_seeds")
    with open(out + ".json", "w") as f:
        json.dump(figures, f)
    drawn = plot(figures, args.tag, out + ".png")
    final = {key: figures[key] for key in ("final_scores", "final_iqm", "final_interval")}
    print(json.dumps({"seeds": args.seeds, "tag": args.tag, "figures": out + ".json", "plot": drawn, **final}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
