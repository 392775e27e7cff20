"""Results over many seeds: the IQM and its stratified-bootstrap interval against rliable's on fixed numbers, and
the seed runner end to end (its runs, curves, figures and plot) and on bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from sf_engine.stats.aggregate import bootstrap_interval, iqm

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# rliable 1.2.0 (arch 7.2.0) on these numbers: metrics.aggregate_iqm and
# library.get_interval_estimates(method='percentile', reps=50000, random_state=RandomState(0)); for the curve, the
# function took the IQM at each point
FINAL = np.array([500.0, 480.0, 12.0, 455.5, 500.0, 320.0, 499.0, 210.0, 470.0, 500.0])[:, None]
FINAL_RLIABLE = (454.0833333333333, [305.1666666666667, 496.3333333333333])
CURVES = np.array(
    [[10, 50, 200], [12, 80, 480], [9, 30, 12], [11, 60, 455.5], [15, 90, 500]]
    + [[8, 40, 320], [10, 70, 499], [13, 20, 210], [9, 55, 470], [14, 100, 500]],
    float,
)[:, None, :]
CURVES_RLIABLE = (
    [10.833333333333334, 59.166666666666664, 405.75],
    [
        [9.333333333333334, 40.833333333333336, 255.66666666666666],
        [12.833333333333334, 78.33333333333333, 488.9166666666667],
    ],
)
TWO_TASKS = np.array([[1.0, 5.0], [2.0, 6.0], [3.0, 9.0], [4.0, 7.0], [10.0, 8.0], [0.0, 4.0]])
TWO_TASKS_RLIABLE = (4.833333333333333, [3.3333333333333335, 7.0])


@pytest.mark.parametrize(
    "scores, expected", [(FINAL, FINAL_RLIABLE), (CURVES, CURVES_RLIABLE), (TWO_TASKS, TWO_TASKS_RLIABLE)]
)
def test_iqm_and_interval_are_rliables(scores, expected):
    """The IQM exactly; the interval's bounds within 1% of the scores' range (both are bootstraps of 50,000
    replicates, drawn by different generators)."""
    point, interval = expected
    assert iqm(scores) == pytest.approx(point, rel=1e-12)
    ours = bootstrap_interval(scores, iqm, 0.95, 50_000, np.random.default_rng(0))
    spread = scores.max() - scores.min()
    assert np.abs(ours.reshape(np.shape(interval)) - np.array(interval)).max() < 0.01 * spread, (ours, interval)


def test_an_interval_is_of_whole_runs_and_narrows_with_more_of_them():
    rng = np.random.default_rng(1)
    few, many = rng.normal(0, 1, (5, 1)), rng.normal(0, 1, (200, 1))
    width = [np.diff(bootstrap_interval(s, reps=2000, rng=np.random.default_rng(0)).ravel())[0] for s in (few, many)]
    assert width[1] < width[0] / 3
    same = np.repeat(np.arange(10.0)[:, None, None], 4, axis=2)  # a curve whose points are all one run's value
    interval = bootstrap_interval(same, reps=500, rng=np.random.default_rng(0))
    assert interval.shape == (2, 4) and np.array_equal(interval, interval[:, :1].repeat(4, 1))  # the same runs


def test_a_resumed_runs_points_replace_those_its_previous_run_wrote_beyond_where_it_resumed():
    from sf_engine.run.seeds import curve_of

    # (wall time, env steps, value): a run to 300 steps, resumed from its checkpoint at 200, on to 400
    points = [(1, 100, 1.0), (2, 200, 2.0), (3, 300, 3.0), (4, 200, 20.0), (5, 300, 30.0), (6, 400, 40.0)]
    steps, values = curve_of(points[::-1])  # in any order: by when they were written
    assert steps.tolist() == [100, 200, 300, 400] and values.tolist() == [1.0, 20.0, 30.0, 40.0]


def _seeds(*argv, cwd):
    cmd = [sys.executable, "-m", "sf_engine.run.seeds", *argv]
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900, env=env)


@pytest.mark.e2e
def test_the_seed_runner_trains_each_seed_and_writes_their_curves_iqm_and_plot(tmp_path, shm_dir):
    flags = ["--env", "CartPole-v1", "--train_for_env_steps", "60000", "--num_workers", "1"]
    flags += ["--train_dir", str(tmp_path), "--shm_dir", shm_dir, "--status_every_sec", "1"]
    out = _seeds("--seeds", "3", "--experiment", "cp", "--points", "5", "--reps", "1000", "--", *flags, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    line = json.loads(out.stdout.strip().splitlines()[-1])
    figures = json.loads((tmp_path / "cp_seeds.json").read_text())
    assert figures["experiments"] == ["cp_seed0", "cp_seed1", "cp_seed2"]
    for seed in range(3):
        config = json.loads((tmp_path / f"cp_seed{seed}" / "config.json").read_text())
        assert config["env"]["seed"] == seed
    curves = np.array(figures["curves"])
    assert curves.shape == (3, 5) and len(figures["env_steps"]) == 5
    assert np.all(curves.min(0) - 1e-9 <= figures["iqm"]) and np.all(figures["iqm"] <= curves.max(0) + 1e-9)
    low, high = figures["interval"]
    assert np.all(np.array(low) <= np.array(high))
    assert line["final_scores"] == curves[:, -1].tolist() and line["final_iqm"] == pytest.approx(np.mean(curves[:, -1]))
    if line["plot"]:
        assert (tmp_path / "cp_seeds.png").stat().st_size > 1000
    again = _seeds("--seeds", "3", "--experiment", "cp", "--points", "5", "--reps", "1000", "--", *flags, cwd=tmp_path)
    assert again.returncode == 0 and json.loads(again.stdout.strip().splitlines()[-1])["final_iqm"] == line["final_iqm"]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--", "--seed", "3"], ["--seed", "drop it"]),
        (["--seeds", "1"], ["--seeds", "at least 2"]),
        (["--", "--learning_rate", "-1"], ["learning_rate"]),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(tmp_path, argv, words):
    out = _seeds(*argv, cwd=tmp_path)
    assert out.returncode == 2 and not list(tmp_path.iterdir()), out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert all(word in last for word in words), out.stderr
