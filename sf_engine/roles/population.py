"""Population-based training (--pbt) and the self-play opponent pool, both run by the learner, which
holds every policy of the run.

PBT: each member (policy) has its own hyperparameters (HYPERPARAMETERS, a LearnerConfig per member).
Every --pbt_period_env_steps of the members' steps (on average per member) a round ranks them by their objective:
the mean return (or the env's true_objective) of the episodes they finished since the previous round,
which the rollout workers count per policy in shared memory (`policy_episodes`). The worst
--pbt_replace_fraction each copy a better member's weights (normalizer statistics included) and
optimizer state (exploit) and mutate their hyperparameters (explore): each, with probability
--pbt_mutation_rate, is drawn anew from its range (RANGES) with probability --pbt_resample_prob, else
multiplied or divided by a factor within [--pbt_perturb_min, --pbt_perturb_max], kept within its
range. Members 1.. start from explored hyperparameters (member 0 keeps the flags' own). Samples a
replaced member acted with its old weights are dropped (counted as dropped for lag).

The opponent pool: every --pool_every_versions versions of policy 0 the learner copies its weights into
the oldest of --pool_size snapshot slots (acting policies num_policies..), which the policy worker
serves like any policy and which are never trained (frozen until replaced by a newer snapshot).
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
HYPERPARAMETERS = tuple(RANGES)


def period(cfg) -> int:
    """Env steps per member between rounds, on average over the members (--pbt_period_env_steps, 'auto'
    resolved): a member whose episodes last longer holds its rows longer and steps more."""
    value = cfg.policies.pbt_period_env_steps
    return 20 * cfg.learner.batch_size * cfg.learner.num_batches_per_epoch if value == "auto" else int(value)


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
    for name in HYPERPARAMETERS:
        if everything:
            out[name] = _draw(name, rng)
        elif rng.random() < pcfg.pbt_mutation_rate:
            if rng.random() < pcfg.pbt_resample_prob:
                out[name] = _draw(name, rng)
            else:
                factor = rng.uniform(pcfg.pbt_perturb_min, pcfg.pbt_perturb_max)
                out[name] = _perturb(name, out[name], factor, bool(rng.random() < 0.5))
    return out


def hyperparameters(lcfg) -> dict:
    return {name: float(getattr(lcfg, name)) for name in HYPERPARAMETERS}


def with_hyperparameters(lcfg, hyper: dict):
    return dataclasses.replace(lcfg, **{name: hyper[name] for name in HYPERPARAMETERS})


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


class EpisodeBooks:
    """Per policy, the episodes and objective sum the rollout workers counted (`policy_episodes`
    [W, P, 2]) at the previous round, so a round sees only the episodes since."""

    def __init__(self, counts):
        self.counts = counts
        self.last = counts.sum(0).copy()

    def objectives(self, members: int) -> list:
        now = self.counts.sum(0)
        delta = now - self.last
        self.last = now.copy()
        return [float(delta[m, 1] / delta[m, 0]) if delta[m, 0] > 0 else None for m in range(members)]


class Population:
    """The learner's PBT rounds and opponent-pool snapshots (each off unless its flags ask for it)."""

    def __init__(self, learner, ctx):
        cfg = ctx.plan.cfg
        self.learner, self.ctx, self.pcfg = learner, ctx, cfg.policies
        self.members = learner.policies
        self.rng = np.random.default_rng([cfg.env.seed % 2**63, 7])  # any integer --seed
        self.period = period(cfg)
        self.steps = [0] * len(self.members)  # each member's steps since the last round
        self.rounds = 0
        self.books = EpisodeBooks(ctx.buffers.policy_episodes) if self.pcfg.pbt else None
        if self.pcfg.pbt:  # a population starts spread out: members 1.. from drawn hyperparameters
            for member in self.members[1:]:
                member.set_hyperparameters(explore(hyperparameters(member.lcfg), self.pcfg, self.rng, everything=True))
        first = self.pcfg.num_policies
        self.snapshots = [ctx.weights(first + i) for i in range(self.pcfg.pool)]
        self.snapshot_params = [self.members[0].params.detach().clone() for _ in range(self.pcfg.pool)]
        self.snapshot_versions = [0] * self.pcfg.pool  # 0: the slot holds no snapshot yet
        self.taken = 0  # snapshots taken so far (the next goes to slot taken % pool_size)

    def share(self, readers: tuple) -> None:
        """Publish the pool's slots to their readers (after a resume: the snapshots it had)."""
        for weights, params, version in zip(self.snapshots, self.snapshot_params, self.snapshot_versions):
            weights.create(params, version, readers)
        if self.pcfg.pbt:
            self._report([])

    def serve_requests(self) -> None:
        for weights in self.snapshots:
            weights.serve_requests()

    def trained(self, policy: int, steps: int) -> None:
        self.steps[policy] += steps

    def step(self) -> None:
        """After a training iteration: a pool snapshot, a PBT round, when due."""
        version = self.members[0].version
        newest = max(self.snapshot_versions, default=0)
        if self.snapshots and version - newest >= self.pcfg.pool_every_versions:
            slot = self.taken % len(self.snapshots)
            self.snapshot_params[slot].copy_(self.members[0].params)
            self.snapshot_versions[slot] = version
            self.snapshots[slot].publish(self.snapshot_params[slot], version)
            self.taken += 1
        if self.books is not None and sum(self.steps) >= self.period * len(self.members):
            self._round()

    def _round(self) -> None:
        objectives = self.books.objectives(len(self.members))
        pairs = exploits(objectives, self.pcfg, self.rng)
        for target, source in pairs:
            member, better = self.members[target], self.members[source]
            member.copy_from(better)
            member.set_hyperparameters(explore(hyperparameters(better.lcfg), self.pcfg, self.rng))
            member.version += 1
            member.min_version = member.version  # what it acted with its old weights is not trained on
            member.weights.publish(member.params, member.version)
        self.rounds += 1
        self.steps = [0] * len(self.members)
        self._report([(target, source, objectives[target], objectives[source]) for target, source in pairs], objectives)

    def _report(self, exploited: list, objectives: list | None = None) -> None:
        from sf_engine.stats.messages import PbtRound

        self.ctx.send(
            PbtRound(
                self.rounds,
                exploited,
                [hyperparameters(m.lcfg) for m in self.members],
                objectives or [None] * len(self.members),
            )
        )

    def state(self) -> dict:
        """What a checkpoint keeps of the population (the members' hyperparameters are in their own)."""
        out = {}
        if self.pcfg.pbt:
            out["pbt"] = {"rounds": self.rounds, "steps": list(self.steps)}
        if self.snapshots:
            out["pool"] = {
                "taken": self.taken,
                "versions": list(self.snapshot_versions),
                "params": [params.detach().cpu().clone() for params in self.snapshot_params],
            }
        return out

    def load(self, state: dict) -> None:
        if self.pcfg.pbt and "pbt" in state:
            self.rounds, self.steps = int(state["pbt"]["rounds"]), [int(x) for x in state["pbt"]["steps"]]
        pool = state.get("pool")
        if self.snapshots and pool and len(pool["versions"]) == len(self.snapshots):
            self.taken, self.snapshot_versions = int(pool["taken"]), [int(v) for v in pool["versions"]]
            for params, saved in zip(self.snapshot_params, pool["params"]):
                params.copy_(saved)
