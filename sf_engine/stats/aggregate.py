"""Figures over many runs that a paper can report (Agarwal et al. 2021, "Deep RL at the edge of the statistical
precipice"): the interquartile mean (IQM) of the runs' scores and its stratified-bootstrap confidence interval.

The same figures as rliable's `metrics.aggregate_iqm` and `library.get_interval_estimates(method='percentile')`
(tests/test_seeds.py compares them on fixed numbers), in NumPy: rliable would add arch, pandas and seaborn to the
install for what is a sort and a resampling here. Scores are [runs, tasks, ...] (one task: [runs, 1, ...]); a
bootstrap replicate draws runs with replacement within each task (stratified), the same draw for every further axis
(every point of a curve), so that a curve's interval comes from whole runs.
"""

from __future__ import annotations

import numpy as np


def iqm(scores: np.ndarray) -> np.ndarray:
    """The mean of the middle half of the runs' scores over runs and tasks (the first two axes; scipy's trim_mean
    with proportiontocut 0.25: int(n / 4) of the n values cut at each end), for each point of the further axes."""
    scores = np.asarray(scores, np.float64)
    flat = np.sort(scores.reshape(-1, *scores.shape[2:]), axis=0)
    cut = int(0.25 * flat.shape[0])
    return flat[cut : flat.shape[0] - cut].mean(axis=0)


def bootstrap_interval(
    scores: np.ndarray, statistic=iqm, size: float = 0.95, reps: int = 50_000, rng: np.random.Generator | None = None
) -> np.ndarray:
    """The `size` percentile interval of `statistic` over `reps` stratified bootstrap replicates of `scores`
    [runs, tasks, ...]: [2, ...] (lower bounds, then upper bounds)."""
    scores = np.asarray(scores, np.float64)
    rng = rng if rng is not None else np.random.default_rng()
    runs, tasks = scores.shape[:2]
    batch = max(1, 2_000_000 // max(scores.size, 1))  # replicates drawn at once: about 16 MB of resampled scores
    values = []
    for start in range(0, reps, batch):
        count = min(batch, reps - start)
        picks = rng.integers(0, runs, (count, runs, tasks))  # per replicate and task, its runs
        resampled = scores[picks, np.arange(tasks)[None, None, :]]  # [count, runs, tasks, ...]
        values.append(np.stack([statistic(replicate) for replicate in resampled]))
    values = np.concatenate(values)
    tail = 100.0 * (1.0 - size) / 2.0
    return np.percentile(values, [tail, 100.0 - tail], axis=0)
