"""The learner's population: population-based training's rounds (--pbt) and the self-play opponent
pool, run by the learner, which holds every policy of the run (the maths: sf_engine.algo.pbt).

PBT: every --pbt_period_env_steps of the members' steps (on average per member) a round ranks them by
their objective: the mean return (or the env's true_objective) of the episodes they finished since the
previous round, which the rollout workers count per policy in shared memory (`policy_episodes`). The
worst copy a better member's weights and optimizer state and mutate their hyperparameters
(sf_engine.algo.pbt). Members 1.. start from explored hyperparameters (member 0 keeps the flags' own).
Samples a replaced member acted with its old weights are dropped (counted as dropped for lag).

The opponent pool: every --pool_every_versions versions of policy 0 the learner copies its weights into
the oldest of --pool_size snapshot slots (acting policies num_policies..), which the policy worker
serves like any policy and which are never trained (frozen until replaced by a newer snapshot).

In a two-player game, the players' ratings, the win rates against the snapshots and the chance of each to be
drawn (--opponent_sampling) are measured from the games the workers count (sf_engine.roles.game_measures).
"""

from __future__ import annotations

import copy
import logging

import numpy as np

from sf_engine.algo.pbt import exploits, explore, period
from sf_engine.roles.game_measures import SelfPlayMeasures
from sf_engine.selfplay.league import LEAGUE_EXPLOITER, MAIN_EXPLOITER, ROLES, starts_over
from sf_engine.stats.messages import PbtRound


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
        self.learner, self.ctx, self.pcfg, self.ranges = learner, ctx, cfg.policies, cfg.algorithm.pbt
        self.members = learner.policies
        self.rng = np.random.default_rng([cfg.env.seed % 2**63, 7])  # any integer --seed
        self.period = period(cfg)
        self.steps = [0] * len(self.members)  # each member's steps since the last round
        self.rounds = 0
        self.books = EpisodeBooks(ctx.buffers.policy_episodes) if self.pcfg.pbt else None
        if self.pcfg.pbt:  # a population starts spread out: members 1.. from drawn hyperparameters
            for member in self.members[1:]:
                member.algorithm.set_hyperparameters(
                    explore(member.algorithm.hyperparameters(), self.ranges, self.pcfg, self.rng, everything=True)
                )
        first = self.pcfg.num_policies
        self.snapshots = [ctx.weights(first + i) for i in range(self.pcfg.pool)]
        self.snapshot_params = [self.members[0].params.detach().clone() for _ in range(self.pcfg.pool)]
        self.snapshot_versions = [0] * self.pcfg.pool  # 0: the slot holds no snapshot yet
        self.taken = 0  # snapshots taken so far (the next goes to slot taken % pool_size)
        self.measures = None  # two-player games: ratings, win rates, who plays whom (only the publishing rank)
        if ctx.buffers.game_results is not None and learner.publishes:
            experiment_dir = None if cfg.run.sampling_only else ctx.plan.paths.experiment_dir
            self.measures = SelfPlayMeasures(
                ctx.buffers, len(self.members), self.pcfg, cfg.env.seed % 2**63, experiment_dir
            )
        # --league: the version each trained player was last frozen at, and the first weights exploiters go back to
        self.frozen_at = [0] * len(self.members)
        self.first_states = (
            {role: copy.deepcopy(self.members[role].algorithm.state()) for role in (MAIN_EXPLOITER, LEAGUE_EXPLOITER)}
            if self.pcfg.league
            else {}
        )

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
        """After a training iteration: pool snapshots (the league's freezes), a PBT round, when due."""
        if self.pcfg.league:
            self._freeze_when_due()
        elif self.snapshots and self.members[0].version - max(self.snapshot_versions) >= self.pcfg.pool_every_versions:
            self._snapshot(0)
        if self.measures is not None:
            ratings = self.measures.measure_when_due(self.versions())
            if ratings is not None:
                self.ctx.send(ratings)
        if self.books is not None and sum(self.steps) >= self.period * len(self.members):
            self._round()

    def _snapshot(self, source: int) -> None:
        """Trained policy `source`'s weights into the oldest pool slot, a frozen player from now on."""
        slot, member = self.taken % len(self.snapshots), self.members[source]
        if self.measures is not None:
            self.measures.take_in()  # the games of the snapshot this one replaces are its own
        self.snapshot_params[slot].copy_(member.params)
        self.snapshot_versions[slot] = member.version
        self.snapshots[slot].publish(self.snapshot_params[slot], member.version)
        self.taken += 1
        if self.measures is not None:
            self.measures.snapshot_taken(len(self.members) + slot, source, member.version)

    def _freeze_when_due(self) -> None:
        """--league: each trained player that wins enough (or has trained long enough) since it was last frozen is
        frozen into the pool; an exploiter may then start over (sf_engine.selfplay.league)."""
        if self.measures is None:
            return
        for role, member in enumerate(self.members):
            since = member.version - self.frozen_at[role]
            if not self.measures.freeze_due(
                role, since, self.pcfg.league_freeze_win_rate, self.pcfg.league_freeze_versions
            ):
                continue
            self._snapshot(role)
            self.frozen_at[role] = member.version
            logging.info("league: %s frozen into the pool at version %d", ROLES[role], member.version)
            if starts_over(role, self.rng):
                self.measures.take_in()  # its games so far are those of the player it was
                member.algorithm.load(self.first_states[role], "its first weights (league)")
                member.publish()
                member.min_version = member.version  # what it acted before is not trained on
                self.measures.started_over(role)
                logging.info("league: %s starts over from its first weights", ROLES[role])

    def saved(self) -> None:
        """The learner wrote a checkpoint (the last one at the stop): the payoff table, up to now, beside it."""
        if self.measures is not None and self.measures.experiment_dir is not None:
            self.measures.take_in()
            self.measures.write_payoff()

    def versions(self) -> list:
        """The version of each acting policy: the trained ones', then each pool slot's snapshot's (0: none yet)."""
        return [m.version for m in self.members] + list(self.snapshot_versions)

    def _round(self) -> None:
        objectives = self.books.objectives(len(self.members))
        pairs = exploits(objectives, self.pcfg, self.rng)
        for target, source in pairs:
            member, better = self.members[target], self.members[source]
            member.algorithm.copy_from(better.algorithm)
            hyper = explore(better.algorithm.hyperparameters(), self.ranges, self.pcfg, self.rng)
            member.algorithm.set_hyperparameters(hyper)
            member.publish()
            member.min_version = member.version  # what it acted with its old weights is not trained on
        self.rounds += 1
        self.steps = [0] * len(self.members)
        self._report([(target, source, objectives[target], objectives[source]) for target, source in pairs], objectives)

    def _report(self, exploited: list, objectives: list | None = None) -> None:
        self.ctx.send(
            PbtRound(
                self.rounds,
                exploited,
                [m.algorithm.hyperparameters() for m in self.members],
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
        if self.pcfg.league:
            out["league"] = {"frozen_at": list(self.frozen_at), "first_states": self.first_states}
        if self.measures is not None:
            out["selfplay"] = self.measures.state()
        return out

    def load(self, state: dict) -> None:
        if self.pcfg.pbt and "pbt" in state:
            self.rounds, self.steps = int(state["pbt"]["rounds"]), [int(x) for x in state["pbt"]["steps"]]
        pool = state.get("pool")
        if self.snapshots and pool and len(pool["versions"]) == len(self.snapshots):
            self.taken, self.snapshot_versions = int(pool["taken"]), [int(v) for v in pool["versions"]]
            for params, saved in zip(self.snapshot_params, pool["params"]):
                params.copy_(saved)
        if self.measures is not None and "selfplay" in state:
            self.measures.load(state["selfplay"])
        if self.measures is not None and pool:
            self.measures.adopt_pool(self.versions())
        league = state.get("league")
        if self.pcfg.league and league and len(league["frozen_at"]) == len(self.members):
            self.frozen_at, self.first_states = [int(v) for v in league["frozen_at"]], league["first_states"]
