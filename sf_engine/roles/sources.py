"""Where the learner's data comes from: a data source, of the kind its algorithm's spec names.

A source hands out data and takes it back; it sends nothing and trains nothing. The learner role
(sf_engine.roles.learner) is one loop over a source: `take` full slots until there is something to train on (or
`hold` slots handed over by a sampler node or a test), then for each policy the `batches` it trains on, each handed
to the algorithm's `train` and back to the source (`trained`), one publication of the policy's weights and the
Training message of the round, its figures the algorithm's and the source's (`figures`); then PBT's and the
opponent pool's step, and `release` when every policy has trained. Between rounds `books_due` gives the figures of
steps taken in and not reported yet. Two sources, each built from explicit arguments:

- TrajectorySource (this module): --slots_per_batch whole slots gathered into one TrajectoryBatch; each policy
  trains once on its own samples of it; the slots go back to the free pool after the round (so in sync mode no
  slot is ever filled by an older policy).
- ReplaySource (sf_engine.roles.replay_source): full slots copied into the replay buffer, minibatches sampled
  out while the replay ratio allows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

import numpy as np
import torch

from sf_engine.algo.base import TrainResult
from sf_engine.algo.batch import SLOT_FIELDS, TrajectoryBatch
from sf_engine.runtime.device_slots import settle
from sf_engine.runtime.transfer import to_device
from sf_engine.stats.messages import Recycled, ReplayStatus
from sf_engine.stats.stages import LearnerStage, StageTimer


@dataclass
class SourceFigures:
    """What a source says of one policy's part of a round, or of the steps it took in between rounds: the figures of
    the Training message beside the algorithm's (sf_engine.stats.messages.Training), and the replay buffer's."""

    not_trainable: int = 0  # steps that may not be trained on (reset steps, absent agents, the pool's)
    skipped_non_finite: int = 0  # steps a rollout worker skipped for a non-finite value
    dropped_lag: int = 0  # samples of the policy's dropped for --max_policy_lag
    lag_count: int = 0  # the samples whose policy lag the next three sum up (0: none)
    lag_min: float = 0.0
    lag_mean: float = 0.0
    lag_max: float = 0.0
    acted: int = 0  # samples the policy acted in the round (PBT's books)
    inserted: int | None = None  # with a replay buffer: trainable env steps put into it
    report_number: int = 0  # with a replay buffer: its reports of inserts, counted across the learner's deaths
    replay: ReplayStatus | None = None  # the replay buffer's books, sent after the Training message


def lag_figures(lag) -> dict:
    """lag_count, lag_min, lag_mean, lag_max of the policy lags `lag` [samples] (a tensor or an array; none: 0s)."""
    if len(lag) == 0:
        return {}
    return {
        "lag_count": len(lag),
        "lag_min": float(lag.min()),
        "lag_mean": float(lag.mean()),
        "lag_max": float(lag.max()),
    }


class DataSource(Protocol):
    """What the learner's loop asks of its data (see the module's docstring); a `policy` is the learner's
    LearningPolicy (its number, version, algorithm)."""

    def take(self, timeout_sec: float) -> bool:
        """Take in full slots (waiting at most `timeout_sec`); True when there is something to train on."""

    def hold(self, slots: list) -> None:
        """Full slots already taken (a sampler node's, a test's) as the next round's data."""

    def ready_batches(self) -> int:
        """After a `take` that said True: the batches it can hand out now (with several learner ranks, each round
        trains as many as the rank with the fewest has)."""

    def limit_round(self, batches: int) -> None:
        """The next round hands out at most `batches` batches."""

    def batches(self, policy) -> Iterator:
        """The batches `policy` trains on in this round, in the form its algorithm's `train` takes."""

    def trained(self, policy, batch, result: TrainResult) -> None:
        """`policy`'s algorithm trained on `batch` (the one `batches` gave last) with `result`."""

    def figures(self, policy, total: TrainResult) -> SourceFigures | None:
        """The figures of `policy`'s part of the round (`total`: what it trained); None: it had no part in it."""

    def books_due(self, finishing: bool = False) -> SourceFigures | None:
        """The figures of what was taken in and not reported yet, when a report of them is due (`finishing`: the
        run stops, every step is booked); else None."""

    def reported(self, figures: SourceFigures) -> None:
        """The Training message carrying `figures` went out: what they booked is cleared."""

    def release(self) -> None:
        """Every policy has trained on this round: what it held goes back."""

    def save(self, checkpoint_dir: str) -> None:
        """Beside a checkpoint just written: whatever the source keeps across runs."""

    def load(self, checkpoint_dir: str) -> None:
        """A resumed run: what `save` kept, where there is some."""


def in_fill_order(buffers, slots: list, deterministic: bool) -> list:
    """`slots` as they came, or under --deterministic in the order of the splits that filled them (their arrival
    follows the clock; a batch's order is that of its floating-point sums, a replay buffer's of its inserts)."""
    return sorted(slots, key=lambda slot: int(buffers.slot_filler[slot])) if deterministic else slots


class TrajectorySource:
    def __init__(
        self,
        cfg,
        pool,
        buffers,
        slot_obs: dict,
        device,
        timer: StageTimer,
        num_policies: int,
        send: Callable,
        slots_per_batch: int,
    ):
        """`pool`: the run's SlotPool; `buffers`: its SharedBuffers; `slot_obs`: key -> the slots' observations
        (runtime.device_slots.slot_obs_arrays; on a GPU in device mode); `timer`: the learner's stage timer;
        `send`: the learner's message queue (a sampling-only run's recycled slots); `slots_per_batch`: the slots of
        one batch (--num_learners: a rank's share of the run's)."""
        self.cfg, self.pool, self.buffers, self.slot_obs, self.device = cfg, pool, buffers, slot_obs, device
        self.timer, self.num_policies, self.send = timer, num_policies, send
        self.slots_per_batch = slots_per_batch
        self.pending: list = []  # full slots taken, the batch not whole yet (freed by the supervisor on a death)
        self.slots: list = []  # the round's slots
        self.batch: TrajectoryBatch | None = None
        self.books = (0, 0)  # the round's (not trainable, skipped non-finite) steps, until a message carries them
        self.marks = None  # the policy training now: its samples of the batch, those it keeps, their lag

    def take(self, timeout_sec: float) -> bool:
        needed = self.slots_per_batch - len(self.pending)
        self.pending += self.pool.take_full(needed, timeout_sec)
        self.timer.lap(LearnerStage.WAIT_DATA)
        if self.cfg.run.sampling_only:
            if self.pending:
                self.send(Recycled(self.pool.recycle(self.pending)))
            self.pending = []
            return False
        if len(self.pending) < self.slots_per_batch:
            return False
        slots, self.pending = in_fill_order(self.buffers, self.pending, self.cfg.run.deterministic), []
        self.hold(slots)
        return True

    def hold(self, slots: list) -> None:
        self.slots, self.batch = slots, self.gather(slots)
        self.books = self._not_trainable(self.batch)  # booked once per batch, with its first report
        self.timer.lap(LearnerStage.BATCH_ASSEMBLY)

    def ready_batches(self) -> int:
        return int(self.batch is not None)

    def limit_round(self, batches: int) -> None:
        pass  # one batch a round

    def batches(self, policy) -> Iterator[TrajectoryBatch]:
        """The batch once, with `keep` marking the samples `policy` acted, valid and within the lag bound (none
        where it acted no sample of a several-policy batch: nothing to train, no new version)."""
        batch, self.marks = self.batch, None
        valid = batch.valid
        mine = valid if batch.policy_id is None else valid & (batch.policy_id[:-1] == policy.policy)
        if self.num_policies > 1 and not bool(mine.any()):
            return
        lag = policy.version - batch.policy_version
        keep = mine & (lag <= self.cfg.learner.max_policy_lag) & (batch.policy_version >= policy.min_version)
        self.marks = (mine, keep, lag)
        yield dataclasses.replace(batch, keep=keep)

    def trained(self, policy, batch, result: TrainResult) -> None:
        pass

    def figures(self, policy, total: TrainResult) -> SourceFigures | None:
        """Its samples of the batch, those dropped for their lag, their lags; the batch's books with the first."""
        if self.marks is None:
            return None
        mine, keep, lag = self.marks
        acted = int(mine.sum())
        return SourceFigures(
            not_trainable=self.books[0],
            skipped_non_finite=self.books[1],
            dropped_lag=int((mine & ~keep).sum()),
            acted=acted,
            **lag_figures(lag[mine].float()),
        )

    def books_due(self, finishing: bool = False) -> SourceFigures | None:
        """The books of a batch no policy trained on; none of a learner rank's share held at the stop (its slots are
        in flight: the run's books count them)."""
        if not any(self.books) or (finishing and self.slots):
            return None
        return SourceFigures(not_trainable=self.books[0], skipped_non_finite=self.books[1])

    def reported(self, figures: SourceFigures) -> None:
        self.books = (0, 0)

    def release(self) -> None:
        self.pool.recycle(self.slots)
        self.slots, self.batch = [], None
        self.timer.lap(LearnerStage.WEIGHT_PUBLISH)

    def save(self, checkpoint_dir: str) -> None:
        pass

    def load(self, checkpoint_dir: str) -> None:
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
            not_trainable += int((batch.valid & (batch.policy_id[:-1] >= self.num_policies)).sum())
        return not_trainable, skipped
