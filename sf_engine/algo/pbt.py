"""Population-based training's maths (--pbt): the hyperparameters it explores and their ranges, exploit
(which members copy which) and explore (how a member's hyperparameters mutate). Pure functions of the
members' objectives and hyperparameters; the learner's Population (sf_engine.roles.population) runs the
rounds.

Each member (policy) has its own hyperparameters (those its algorithm's spec names, within RANGES; a LearnerConfig
per member). A round
ranks the members by their objective; the worst --pbt_replace_fraction each copy a better member's
weights and optimizer state (exploit) and mutate their hyperparameters (explore): each, with probability
--pbt_mutation_rate, is drawn anew from its range (RANGES) with probability --pbt_resample_prob, else
multiplied or divided by a factor within [--pbt_perturb_min, --pbt_perturb_max], kept within its range.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

# the hyperparameters PBT explores, with the ranges they are drawn from and kept within
RANGES = {
    "learning_rate": (1e-5, 1e-2),
    "entropy_coeff": (1e-4, 5e-2),
    "gamma": (0.9, 0.999),
    "ppo_clip_ratio": (0.05, 0.4),
}


def period(cfg) -> int:
    """Env steps per member between rounds, on average over the members (--pbt_period_env_steps, 'auto'
    resolved): a member whose episodes last longer holds its rows longer and steps more."""
    value = cfg.policies.pbt_period_env_steps
    return 20 * cfg.learner.train_batch if value == "auto" else int(value)


def _draw(name: str, rng: np.random.Generator) -> float:
    low, high = RANGES[name]
    if name == "gamma":  # log-uniform horizon: 1 - gamma between 1e-3 and 0.1
        return 1.0 - math.exp(rng.uniform(math.log(1.0 - high), math.log(1.0 - low)))
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def _perturb(name: str, value: float, factor: float, up: bool) -> float:
    low, high = RANGES[name]
    if name == "gamma":  # the horizon 1 / (1 - gamma) is what scales
        horizon = 1.0 - value
        value = 1.0 - (horizon / factor if up else horizon * factor)
    else:
        value = value * factor if up else value / factor
    return float(min(max(value, low), high))


def explore(hyper: dict, pcfg, rng: np.random.Generator, everything: bool = False) -> dict:
    """Mutated hyperparameters (`everything`: each drawn anew from its range, a new member's start)."""
    out = dict(hyper)
    for name in hyper:
        if everything:
            out[name] = _draw(name, rng)
        elif rng.random() < pcfg.pbt_mutation_rate:
            if rng.random() < pcfg.pbt_resample_prob:
                out[name] = _draw(name, rng)
            else:
                factor = rng.uniform(pcfg.pbt_perturb_min, pcfg.pbt_perturb_max)
                out[name] = _perturb(name, out[name], factor, bool(rng.random() < 0.5))
    return out


def hyperparameters(lcfg, names: tuple) -> dict:
    """The values in `lcfg` of the hyperparameters `names` (an algorithm's spec's `pbt`, within RANGES)."""
    return {name: float(getattr(lcfg, name)) for name in names}


def with_hyperparameters(lcfg, hyper: dict):
    return dataclasses.replace(lcfg, **hyper)


def exploits(objectives: list, pcfg, rng: np.random.Generator) -> list:
    """[(replaced member, member it copies)] of one round; members with no objective (no episode since
    the last round) take no part. The worst --pbt_replace_fraction (at least one) each copy one of the
    best as many, when it trails that one by --pbt_replace_reward_gap of the objectives' range."""
    ranked = sorted((value, member) for member, value in enumerate(objectives) if value is not None)
    if len(ranked) < 2:
        return []
    count = max(1, int(round(pcfg.pbt_replace_fraction * len(ranked))))
    spread = ranked[-1][0] - ranked[0][0]
    best = [member for _, member in ranked[-count:]]
    pairs = []
    for value, member in ranked[:count]:
        source = int(rng.choice(best))
        if (
            source != member
            and objectives[source] - value > max(pcfg.pbt_replace_reward_gap * spread, 0.0)
            and objectives[source] > value
        ):
            pairs.append((member, source))
    return pairs
