"""Population-based training's maths (--pbt): the hyperparameters it explores and their ranges, exploit
(which members copy which) and explore (how a member's hyperparameters mutate). Pure functions of the
members' objectives and hyperparameters; the learner's Population (sf_engine.roles.population) runs the
rounds.

Each member (policy) has its own hyperparameters (those its algorithm's spec names, each within its Range: a Config
per member). A round
ranks the members by their objective; the worst --pbt_replace_fraction each copy a better member's
weights and optimizer state (exploit) and mutate their hyperparameters (explore): each, with probability
--pbt_mutation_rate, is drawn anew from its range with probability --pbt_resample_prob, else
multiplied or divided by a factor within [--pbt_perturb_min, --pbt_perturb_max], kept within its range.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from sf_engine.config.algorithms import Range


def period(cfg) -> int:
    """Env steps per member between rounds, on average over the members (--pbt_period_env_steps, 'auto'
    resolved): a member whose episodes last longer holds its rows longer and steps more."""
    value = cfg.policies.pbt_period_env_steps
    return 20 * cfg.train_batch if value == "auto" else int(value)


def _draw(limits: Range, rng: np.random.Generator) -> float:
    low, high = limits.low, limits.high
    if limits.horizon:  # log-uniform horizon: 1 - gamma between 1 - high and 1 - low
        return 1.0 - math.exp(rng.uniform(math.log(1.0 - high), math.log(1.0 - low)))
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def _perturb(limits: Range, value: float, factor: float, up: bool) -> float:
    if limits.horizon:  # the horizon 1 / (1 - gamma) is what scales
        horizon = 1.0 - value
        value = 1.0 - (horizon / factor if up else horizon * factor)
    else:
        value = value * factor if up else value / factor
    return float(min(max(value, limits.low), limits.high))


def explore(hyper: dict, ranges: dict, pcfg, rng: np.random.Generator, everything: bool = False) -> dict:
    """Mutated hyperparameters (`ranges`: name -> Range, the algorithm's spec's `pbt`; `everything`: each drawn anew
    from its range, a new member's start)."""
    out = dict(hyper)
    for name in hyper:
        if everything:
            out[name] = _draw(ranges[name], rng)
        elif rng.random() < pcfg.pbt_mutation_rate:
            if rng.random() < pcfg.pbt_resample_prob:
                out[name] = _draw(ranges[name], rng)
            else:
                factor = rng.uniform(pcfg.pbt_perturb_min, pcfg.pbt_perturb_max)
                out[name] = _perturb(ranges[name], out[name], factor, bool(rng.random() < 0.5))
    return out


def _group_of(cfg, name: str):
    """(group name, group) of `cfg` that has the field `name`: the learner's or the algorithm's own."""
    return next((group_name, group) for group_name, group in cfg.groups().items() if hasattr(group, name))


def hyperparameters(cfg) -> dict:
    """The values in `cfg` (a member's Config) of the hyperparameters its algorithm's spec lets PBT explore (`pbt`:
    fields of the learner group or of the algorithm's own)."""
    return {name: float(getattr(_group_of(cfg, name)[1], name)) for name in cfg.algorithm.pbt}


def with_hyperparameters(cfg, hyper: dict):
    """`cfg` with the hyperparameters `hyper`, each in its group."""
    changes: dict = {}
    for name, value in hyper.items():
        group_name, group = _group_of(cfg, name)
        changes.setdefault(group_name, (group, {}))[1][name] = value
    groups = {name: dataclasses.replace(group, **values) for name, (group, values) in changes.items()}
    own = cfg.algorithm.config[0] if cfg.algorithm.config else None
    return dataclasses.replace(
        cfg, **{("algo_group" if name == own else name): group for name, group in groups.items()}
    )


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
