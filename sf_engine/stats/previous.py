"""summary.json across the runs of an experiment: a resumed run that trains little (no episode finished, no
batch trained, no evaluation yet) keeps the figures of the run it resumed rather than writing them empty.
Runs in the main process (sf_engine.stats.report writes summary.json)."""

from __future__ import annotations

import json

# the figures a run may end without (a resumed run that trains little: no episode finished, no batch trained,
# no evaluation), each with its value then: summary.json keeps the previous run's figure of the experiment
# instead, and lists the fields it kept under `carried_over`
CARRIED_OVER = {
    "episode_return_mean": None,
    "episodes": 0,
    "episode_extra_stats": {},
    "episode_return_by_seat": None,
    "policy_lag_mean": None,
    "policy_lag_max": None,
    "learner_version": 0,
    "bottleneck": None,
    "bottleneck_report": None,
    "checkpoint": None,
    "eval_return_mean": None,
    "eval_return_best": None,
    "eval_win_rate_vs_random": None,
    "eval_draw_rate_vs_random": None,
    "eval_loss_rate_vs_random": None,
    "eval_version": None,
    "policies": None,
    "pbt": None,
    "ratings": None,
}


def read_summary(path: str) -> dict:
    """A summary.json's figures, or {} when there is none (or it cannot be read)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def carry_over(data: dict, previous: dict) -> dict:
    """`data` (a summary) with each CARRIED_OVER figure it lacks taken from `previous` (the summary of the run
    this one resumed), and `carried_over`: the fields so taken."""
    carried = [
        key for key, empty in CARRIED_OVER.items() if data.get(key) == empty and previous.get(key) not in (None, empty)
    ]
    return {**data, **{key: previous[key] for key in carried}, "carried_over": carried}
