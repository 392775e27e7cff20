"""Where the learner's data comes from: a data source, of the kind its algorithm's spec names.

The learner role (sf_engine.roles.learner) is one loop over a source: `take` full slots until there is something
to train on, then for each policy the `batches` it trains on, each handed to the algorithm's `train` and back to
the source (`trained`), one publication of the policy's weights, the source's `report` of the round, and `done`
when every policy has trained. Two sources:

- TrajectorySource (this module): --slots_per_batch whole slots gathered into one TrajectoryBatch; each policy
  trains once on its own samples of it; the slots go back to the free pool after the round (so in sync mode no
  slot is ever filled by an older policy).
- ReplaySource (sf_engine.roles.replay_source): full slots copied into the replay buffer, minibatches sampled
  out while the replay ratio allows.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Protocol

import numpy as np
import torch

from sf_engine.algo.base import TrainResult
from sf_engine.algo.batch import SLOT_FIELDS, TrajectoryBatch
from sf_engine.runtime.device_slots import settle, slot_obs_arrays
from sf_engine.runtime.transfer import to_device
from sf_engine.stats.messages import Recycled, Training
from sf_engine.stats.stages import LearnerStage


class DataSource(Protocol):
    """What the learner's loop asks of its data (see the module's docstring); a `policy` is the learner's
    LearningPolicy (its number, version, algorithm)."""

    def take(self, timeout_sec: float) -> bool:
        """Take in full slots (waiting at most `timeout_sec`); True when there is something to train on."""

    def batches(self, policy) -> Iterator:
        """The batches `policy` trains on in this round, in the form its algorithm's `train` takes."""

    def trained(self, policy, batch, result: TrainResult) -> None:
        """`policy`'s algorithm trained on `batch` (the one `batches` gave last) with `result`."""

    def report(self, policy, total: TrainResult, train_sec: float) -> None:
        """`policy`'s part of the round done and published: its Training message (the role's figures)."""

    def done(self) -> None:
        """Every policy has trained on this round: what it held goes back."""

    def finish(self) -> None:
        """The run stops: what is booked and not reported yet goes out."""

    def save(self, checkpoint_dir: str) -> None:
        """Beside a checkpoint just written: whatever the source keeps across runs."""


def in_fill_order(buffers, slots: list, deterministic: bool) -> list:
    """`slots` as they came, or under --deterministic in the order of the splits that filled them (their arrival
    follows the clock; a batch's order is that of its floating-point sums, a replay buffer's of its inserts)."""
    return sorted(slots, key=lambda slot: int(buffers.slot_filler[slot])) if deterministic else slots


class TrajectorySource:
    def __init__(self, learner):
        """`learner`: the Learner this source feeds (its context, slot pool, stage timer, policies and
        population are read, never its data)."""
        self.ctx, self.cfg, self.pool, self.timer = learner.ctx, learner.cfg, learner.pool, learner.timer
        self.buffers, self.device = learner.buffers, learner.device
        self.slot_obs = slot_obs_arrays(learner.ctx)  # device mode on a GPU: in its memory
        self.policies, self.population = learner.policies, learner.population
        self.pending: list = []  # full slots taken, the batch not whole yet (freed by the supervisor on a death)
        self.slots: list = []  # the round's slots
        self.batch: TrajectoryBatch | None = None
        self.books = (0, 0)  # the round's (not trainable, skipped non-finite) steps, until a message carries them
        self.marks = None  # the policy training now: its samples of the batch, those it keeps, their lag

    def take(self, timeout_sec: float) -> bool:
        needed = self.cfg.slots_per_batch - len(self.pending)
        self.pending += self.pool.take_full(needed, timeout_sec)
        self.timer.lap(LearnerStage.WAIT_DATA)
        if self.cfg.run.sampling_only:
            if self.pending:
                self.ctx.send(Recycled(self.pool.recycle(self.pending)))
            self.pending = []
            return False
        if len(self.pending) < self.cfg.slots_per_batch:
            return False
        slots, self.pending = in_fill_order(self.buffers, self.pending, self.cfg.run.deterministic), []
        self.hold(slots)
        return True

    def hold(self, slots: list) -> None:
        """`slots` (full, taken) as the round's batch."""
        self.slots, self.batch = slots, self.gather(slots)
        self.books = self._not_trainable(self.batch)  # booked once per batch, with its first report
        self.timer.lap(LearnerStage.BATCH_ASSEMBLY)

    def batches(self, policy) -> Iterator[TrajectoryBatch]:
        """The batch once, with `keep` marking the samples `policy` acted, valid and within the lag bound (none
        where it acted no sample of a several-policy batch: nothing to train, no new version)."""
        batch, self.marks = self.batch, None
        valid = batch.valid
        mine = valid if batch.policy_id is None else valid & (batch.policy_id[:-1] == policy.policy)
        if len(self.policies) > 1 and not bool(mine.any()):
            return
        lag = policy.version - batch.policy_version
        keep = mine & (lag <= self.cfg.learner.max_policy_lag) & (batch.policy_version >= policy.min_version)
        self.marks = (mine, keep, lag)
        yield dataclasses.replace(batch, keep=keep)

    def trained(self, policy, batch, result: TrainResult) -> None:
        pass

    def report(self, policy, total: TrainResult, train_sec: float) -> None:
        if self.marks is None:
            return
        mine, keep, lag = self.marks
        self.population.trained(policy.policy, int(mine.sum()))
        self._send(policy, total, train_sec, mine, keep, lag)

    def done(self) -> None:
        if any(self.books):  # no policy trained on this batch: its books still count
            self._send(self.policies[0], TrainResult(0))
        self.population.step()  # a PBT round or a pool snapshot when one is due
        self.pool.recycle(self.slots)
        self.slots, self.batch = [], None
        self.timer.lap(LearnerStage.WEIGHT_PUBLISH)

    def finish(self) -> None:
        pass

    def save(self, checkpoint_dir: str) -> None:
        pass

    def gather(self, slots: list) -> TrajectoryBatch:
        """Copy the slots out of shared memory, time-major: obs[key] [T+1, N, *shape], the step fields
        [T, N, ...] (N = slots x envs per split); every field of SLOT_FIELDS the run has."""
        index = np.asarray(slots)

        def time_major(array):  # [S, R, E, ...] -> [R, S * E, ...]
            picked = array[index].swapaxes(0, 1)
            return to_device(picked, self.device).reshape(picked.shape[0], -1, *picked.shape[3:])

        fields = {field.name: getattr(self.buffers, field.name) for field in SLOT_FIELDS}

        def on_device(array):  # in the device's memory already: gathered there, read before the slots go back
            picked = array[torch.as_tensor(index, device=array.device)].transpose(0, 1)
            batch = picked.reshape(picked.shape[0], -1, *picked.shape[3:]).to(self.device)
            settle(array)
            return batch

        return TrajectoryBatch(
            obs={
                key: time_major(array) if isinstance(array, np.ndarray) else on_device(array)
                for key, array in self.slot_obs.items()
            },
            **{name: time_major(array) for name, array in fields.items() if array is not None},
        )

    def _not_trainable(self, batch: TrajectoryBatch) -> tuple[int, int]:
        """(steps not trainable, steps skipped for a non-finite value): reset steps and absent agents, and
        the steps the opponent pool's snapshots acted; the steps a rollout worker skipped (`non_finite`,
        never valid) apart."""
        skipped = int(batch.non_finite.sum())
        not_trainable = int((~batch.valid).sum()) - skipped
        if batch.policy_id is not None:
            not_trainable += int((batch.valid & (batch.policy_id[:-1] >= len(self.policies))).sum())
        return not_trainable, skipped

    def _send(self, policy, result: TrainResult, train_sec=0.0, mine=None, keep=None, lag=None) -> None:
        """The Training message of `policy`'s part of the batch: `mine` [T, N] its samples, `keep` those it
        trained on, `lag` their policy lag; without them, of a batch no policy trained on. The batch's books
        go with the first message."""
        mine_lag = lag[mine].float() if mine is not None and bool(mine.any()) else torch.zeros(1)
        books, self.books = self.books, (0, 0)
        self.ctx.send(
            Training(
                self.timer.report("learner"),
                version=policy.version,
                samples=result.samples,
                dropped_lag=0 if mine is None else int((mine & ~keep).sum()),
                not_trainable=books[0],
                lag_count=0 if mine is None else int(mine.sum()),
                lag_min=float(mine_lag.min()),
                lag_mean=float(mine_lag.mean()),
                lag_max=float(mine_lag.max()),
                learning_rate=policy.algorithm.learning_rate,
                losses=result.losses,
                policy=policy.policy,
                train_sec=train_sec,
                skipped_non_finite=books[1],
                skipped_updates=result.skipped_updates,
            )
        )
