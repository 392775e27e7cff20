"""The ranks of one policy's learner (--num_learners > 1, or node groups on several machines: --dist_init), as the
learner of one rank sees them.

Each rank is a learner process (sf_engine.roles.learner, its role's index its rank) on its own device, joined to the
others by torch.distributed (sf_engine.runtime.ranks.RankGroup). Each takes its own share of every batch's trajectory
slots; before each round the ranks agree (one all-reduce) on whether every one holds its share, whether the run stops
(all of them leave their loops after the same round) and on the env steps and seconds of the round's schedules. The
algorithm averages its gradients and merges its normalizers' statistics over them (its TrainingState.join_ranks), so
every rank holds the same weights, compared after every round; rank 0 alone publishes them, keeps the training state,
writes the checkpoints and reports the round's figures of all the ranks, gathered. With node groups, each node group's
rank 0 does so for its node group (its policy workers, its experiment directory, its own figures); the ranks of all
node groups start from global rank 0's state and agree on the env steps of all of them and on one stop.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os

import torch

from sf_engine.algo.base import TrainResult
from sf_engine.config.parallel import node_groups
from sf_engine.roles.sources import SourceFigures
from sf_engine.runtime.checkpoint import policy_states, state_bytes, state_of_bytes
from sf_engine.runtime.ranks import Agreement, RankGroup, checksum
from sf_engine.runtime.rendezvous import Rendezvous
from sf_engine.runtime.role import RoleContext, RunStopped
from sf_engine.runtime.shared_buffers import GROUP_BUDGET, OTHER_GROUP_STOPPED, RENDEZVOUS_SUFFIX

STOP_CHECK_STEPS = 16  # within a round, the ranks agree on the stop every this many minibatch steps


class LearnerRanks:
    def __init__(self, learner, ctx: RoleContext):
        """Join the other ranks (on one machine, a rendezvous file beside the run's shared memory, removed before
        each start of them; with node groups, the ranks of every node group in the rendezvous's next generation);
        each policy's algorithm then averages its gradients and merges its normalizers' statistics over the ranks.
        On one machine they built the same state (the same seed, checkpoint or kept state); with node groups each
        takes rank 0's (a node group has its own checkpoints and kept state): compared at once."""
        self.learner, self.ctx = learner, ctx
        self.rank, self.world = learner.rank, learner.num_ranks  # on this node group
        groups = node_groups(learner.cfg.parallel, os.environ)
        self.node, nodes = (groups.node, groups.nodes) if groups is not None else (0, 1)
        self.rendezvous: Rendezvous | None = None  # node groups: where they meet
        self.group = self._join(groups, learner.device, learner.cfg.parallel.collective_timeout_sec)
        for policy in learner.policies:
            policy.algorithm.join_ranks(self.group)
        if nodes > 1:
            self._take_first_ranks_state()
        for policy in learner.policies:
            policy.counted_weights = policy.params.detach().clone()
        self.check_same_weights("at the start")
        # --train_for_env_steps with node groups: the ranks stop at the budget of every node group's env steps (the
        # same on every node group: a part of the shape compared at the join)
        self.group_budget = learner.cfg.run.train_for_env_steps if nodes > 1 else None
        self.ready = False  # this rank holds its share of the next batch
        self.agreed: Agreement | None = None  # what the ranks agreed on for the round
        self.round_steps, self.round_stop = 0, False  # the round's minibatch steps so far; a stop agreed within it
        self.others_slots: list = []  # rank 0: the other ranks' slots of the round, gathered, which it puts back
        ctx.agreed_stop = False  # from now on the ranks stop together (agree_on_round)

    def _join(self, groups, device: torch.device, timeout_sec: float) -> RankGroup:
        """This rank in the group of all ranks: rank node x ranks + local rank of node groups x ranks.
        NodeGroupsStopped where the node groups stopped while it joined."""
        backend = self.learner.cfg.parallel.collective_backend(self.learner.cfg.run.device)
        if groups is None:
            meet = f"file://{self.learner.buffers.path}{RENDEZVOUS_SUFFIX}"
            return RankGroup(self.rank, self.world, meet, device, timeout_sec, backend=backend)
        rank, world = groups.node * self.world + self.rank, groups.nodes * self.world
        self.rendezvous = Rendezvous(groups, rank, world, timeout_sec, self.ctx.beat, _shape(self.learner.cfg, world))
        generation, store = self.rendezvous.join(lambda: self.ctx.stop_signalled)
        return RankGroup(
            rank, world, store, device, timeout_sec, groups.nodes, lambda: self.rendezvous.leave(generation), backend
        )

    def _take_first_ranks_state(self) -> None:
        """Every rank goes on from rank 0's training state (of node group 0: its checkpoint, kept state or start), at
        the highest version of any rank's (a node group's checkpoints never go back in version)."""
        learner = self.learner
        first = self.group.rank == 0
        body = self.group.broadcast_bytes(state_bytes(learner.training_state()) if first else None)
        if not first:
            state = state_of_bytes(body, learner.device, "learner rank 0's state")
            for policy, policy_state in zip(learner.policies, policy_states(state)):
                policy.algorithm.load(policy_state, "learner rank 0's state")
            learner.population.load(state)
        versions = self.group.maximum([policy.version for policy in learner.policies], "the ranks' versions")
        for policy, version in zip(learner.policies, versions):
            policy.version = version
        logging.info("every rank goes on from learner rank 0's training state, at version(s) %s", versions)

    @property
    def env_steps(self) -> int:
        return self.learner.env_steps if self.agreed is None else self.agreed.env_steps

    @property
    def elapsed_sec(self) -> float:
        return self.learner.elapsed_sec if self.agreed is None else self.agreed.elapsed_sec

    def agree_on_round(self, timeout_sec: float) -> bool:
        """This rank takes its share of a batch (and holds it until the others have theirs), then the ranks agree:
        True when every rank holds its share (a round to train now, of as many batches as every rank's source can
        hand out); the stop when any saw it (`ctx.stopping` then says so on every rank, after the same round)."""
        learner = self.learner
        if not self.ready:
            self.ready = learner.source.take(timeout_sec)
        batches = learner.source.ready_batches() if self.ready else 0
        self.agreed = self.group.agree(batches, self.ctx.stop_signalled, learner.env_steps, learner.elapsed_sec)
        budget_spent = self.group_budget is not None and self.agreed.env_steps >= self.group_budget
        if self.agreed.stop or budget_spent:
            if self.rendezvous is not None:  # node groups: every rank says why, for its runner and a late joiner
                self.rendezvous.stop()
                if not self.ctx.stop_signalled:
                    learner.buffers.node_groups[0] = GROUP_BUDGET if budget_spent else OTHER_GROUP_STOPPED
            self.ctx.agreed_stop = True
            return False
        if not self.agreed.all_ready:
            return False
        learner.source.limit_round(self.agreed.batches)
        self.ready = False
        self.round_steps, self.round_stop = 0, False
        return True

    def stopping(self) -> bool:
        """The algorithm's `hooks.stopping`, asked once per minibatch step on every rank: whether the ranks agreed
        to stop, looked for every STOP_CHECK_STEPS steps of a round (one all-reduce), so that a long round ends
        early at a stop on every rank alike, as one learner's does."""
        return self.round_over(False)

    def round_over(self, over: bool) -> bool:
        """Whether the round ends: the ranks agree every STOP_CHECK_STEPS minibatch steps on whether any rank saw the
        stop or passed its round's time (`over`: a replay source's chunk of updates between two publications)."""
        self.round_steps += 1
        if not self.round_stop and self.round_steps % STOP_CHECK_STEPS == 0:
            agreed = self.group.agree(int(not over), self.ctx.stop_signalled, 0, 0.0)
            self.round_stop = agreed.stop or not agreed.all_ready
        return self.round_stop

    def check_same_weights(self, when: str) -> None:
        """Every rank holds the same weights (a checksum of every policy's, compared): else the run stops, one line."""
        if not self.group.same_everywhere(checksum(*(policy.params for policy in self.learner.policies))):
            raise RunStopped(
                f"learner rank {self.rank} of {self.world}: the ranks' weights differ {when} (version "
                f"{self.learner.version}); data-parallel learning needs the same update on every rank"
            )

    def gathered(self, total: TrainResult, figures: SourceFigures | None, train_sec: float) -> tuple:
        """(TrainResult, SourceFigures, seconds) of a policy's round on every rank of this node group as one (each
        node group reports its own run), on every rank: counts summed, losses averaged, the lags of all, the
        longest training time. The ranks' slots of the round go with them (release_round)."""
        figures = figures or SourceFigures()
        names = sorted(total.losses)  # the same on every rank: they took the same steps
        counts = [total.samples, figures.dropped_lag, figures.not_trainable, figures.skipped_non_finite, figures.acted]
        lags = [figures.lag_count, figures.lag_mean * figures.lag_count, figures.lag_min, figures.lag_max]
        slots = list(self.learner.source.slots)  # an equal share on every rank (a replay source frees its own)
        losses = [total.losses[name] for name in names]
        row = torch.tensor(counts + lags + [train_sec] + losses + slots, dtype=torch.float64)
        rows = self.group.gather(row).cpu()[self.node * self.world : (self.node + 1) * self.world]  # this node group
        self.others_slots = [int(s) for s in rows[1:, len(row) - len(slots) :].reshape(-1).tolist()]
        sums = [int(x) for x in rows[:, : len(counts)].sum(0).tolist()]
        lag_rows = rows[:, len(counts) : len(counts) + len(lags)]
        lagged = lag_rows[lag_rows[:, 0] > 0]
        lag = {}
        if len(lagged):
            count = float(lagged[:, 0].sum())
            lag = dict(
                lag_count=int(count),
                lag_mean=float(lagged[:, 1].sum()) / count,
                lag_min=float(lagged[:, 2].min()),
                lag_max=float(lagged[:, 3].max()),
            )
        replay = figures.replay  # rank 0's: every rank's buffer (ReplaySource), the ages of every rank's samples
        if replay is not None and lag:
            replay = dataclasses.replace(replay, age_mean=lag["lag_mean"], age_max=lag["lag_max"])
        merged = dataclasses.replace(
            figures,
            dropped_lag=sums[1],
            not_trainable=sums[2],
            skipped_non_finite=sums[3],
            acted=sums[4],
            replay=replay,
            **lag,
        )
        start = len(counts) + len(lags) + 1
        losses = dict(zip(names, rows[:, start : start + len(names)].mean(0).tolist()))
        train_sec = float(rows[:, len(counts) + len(lags)].max())
        return dataclasses.replace(total, samples=sums[0], losses=losses), merged, train_sec

    def release_round(self) -> None:
        """The round's slots back to the free pool, every rank's by rank 0, after its report: a rank that dies once
        its figures were gathered (reported by rank 0 as trained) leaves no slot of the round for the supervisor to
        book again as dropped."""
        source = self.learner.source
        if self.rank == 0:
            self.learner.pool.recycle(self.others_slots)
        else:
            source.slots = []  # rank 0 puts them back with its own
        self.others_slots = []
        source.release()

    def close(self) -> None:
        self.group.close()


# what may differ between node groups: their places, machines, samplers and outputs (the rest of the flags shapes the
# training every rank takes part in: the same on every node group)
_PER_NODE = {
    "env": ("seed",),
    "sampler": ("num_workers", "num_envs_per_worker", "worker_num_splits"),
    "learner": ("learner_threads",),
    "parallel": ("dist_init", "dist_rank", "num_policy_workers", "collective_timeout_sec"),
    "run": tuple(
        name
        for name in (
            "config",
            "experiment",
            "train_dir",
            "device",
            "bf16",
            "compile",
            "train_for_seconds",
            "stop_at_return",
            "stop_at_eval_return",
            "save_every_sec",
            "keep_checkpoints",
            "restart",
            "status_every_sec",
            "eval_every_sec",
            "eval_episodes",
            "eval_max_steps",
            "cpu_affinity",
            "shm_dir",
            "stuck_timeout_sec",
            "max_worker_restarts",
        )
    ),
}
_NOT_COMPARED = ("tracking", "remote")


def _shape(cfg, world: int) -> str:
    """What every rank of every node group must share, as one line: their number, each one's share of a batch, and a
    digest of the flags that shape training (all but _PER_NODE's and _NOT_COMPARED's groups)."""
    flags = {
        group: {name: value for name, value in values.items() if name not in _PER_NODE.get(group, ())}
        for group, values in cfg.to_dict().items()
        if group not in _NOT_COMPARED
    }
    digest = hashlib.sha256(json.dumps(flags, sort_keys=True, default=str).encode()).hexdigest()[:12]
    local = cfg.parallel.num_learners
    return (
        f"{world} ranks of --algo {cfg.learner.algo}, each {cfg.slots_per_batch // local} slots of "
        f"{cfg.sampler.rollout} x {cfg.sampler.envs_per_split} a batch, minibatches of {cfg.minibatch // local}, "
        f"flags {digest}"
    )
