"""What prioritized replay's sampling structure costs the learner: SumTree.sample(batch) and SumTree.update(batch)
(sf_engine/replay/sum_tree.py) on a full tree of `--capacity` leaves, in microseconds, as a learner step calls
them: draw a minibatch, then set the new priorities of the leaves it drew.

  python perf/replay_sampling.py --capacity 100000
  python perf/replay_sampling.py --capacity 1000000 --batch 128
  python perf/replay_sampling.py --way numpy      # NumPy's way, where the compiled kernels are built too

Every leaf starts with a priority > 0 (a full buffer); each new priority is a fresh uniform draw. Each figure is
the median over `--windows` windows of `--steps` steps, after one window of warm-up. One JSON line last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from sf_engine.replay.sum_tree import FANOUT, TOP_NODES, SumTree


def window(tree: SumTree, batch: int, steps: int, rng: np.random.Generator) -> tuple[float, float]:
    """Mean microseconds of one sample and of one update over `steps` learner steps."""
    sample_sec = update_sec = 0.0
    for _ in range(steps):
        priorities = rng.random(batch)
        start = time.perf_counter()
        indices = tree.sample(batch, rng)
        drawn = time.perf_counter()
        tree.update(indices, priorities)
        sample_sec += drawn - start
        update_sec += time.perf_counter() - drawn
    return sample_sec / steps * 1e6, update_sec / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--capacity", type=int, default=1_000_000, help="leaves of the tree (transitions stored)")
    parser.add_argument("--batch", type=int, default=128, help="transitions drawn and updated per learner step")
    parser.add_argument("--steps", type=int, default=500, help="learner steps per window")
    parser.add_argument("--windows", type=int, default=9, help="windows measured after the warm-up")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--way", choices=("compiled", "numpy"), default=None, help="the tree's (default: compiled where built)"
    )
    args = parser.parse_args()
    if args.capacity < 1 or args.batch < 1 or args.steps < 1 or args.windows < 1:
        parser.error("--capacity, --batch, --steps and --windows must be >= 1")
    rng = np.random.default_rng(args.seed)
    tree = SumTree(args.capacity, compiled=None if args.way is None else args.way == "compiled")
    tree.update(np.arange(args.capacity), rng.random(args.capacity) + 1e-3)
    window(tree, args.batch, args.steps, rng)  # warm-up
    figures = [window(tree, args.batch, args.steps, rng) for _ in range(args.windows)]
    sample_us = statistics.median(sample for sample, _ in figures)
    update_us = statistics.median(update for _, update in figures)
    print(
        json.dumps(
            {
                "metric": "replay_sampling",
                "way": "compiled" if tree.compiled else "numpy",
                "capacity": args.capacity,
                "batch": args.batch,
                "fanout": FANOUT,
                "top_nodes": TOP_NODES,
                "sample_us": round(sample_us, 1),
                "update_us": round(update_us, 1),
                "us_per_transition": round((sample_us + update_us) / args.batch, 3),
                "windows": args.windows,
                "steps_per_window": args.steps,
            }
        )
    )


if __name__ == "__main__":
    main()
