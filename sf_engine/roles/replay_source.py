"""The learner's data source with a replay buffer (an algorithm whose spec learns from a replay transform): full
trajectory slots copied into the buffer and freed, samples drawn out and trained on, the replay ratio held by the
rate limiter (sf_engine.roles.sources says how the learner's loop uses a source). What a sample is (an n-step
transition, a sequence, an algorithm's own) is the transform's (sf_engine.replay.transform).

Runs in the learner process (or the runner in serial mode), for one policy. Each step of the learner either
takes full slots (when the ratio allows no training: learning waits for data) or trains a round: minibatches
while the ratio allows one, for at most CHUNK_SEC, then one publication of the weights. In async mode a slot is
freed as soon as it is copied in, so sampling waits only when the learner holds the next full slots back to keep
the ratio (learning is the slower side: the rollout workers' wait for a free slot says how long). In sync mode
the learner takes one slot of every split, trains what they allow, publishes, and only then frees them: every
sample is acted by the newest policy. An algorithm's `observe` (given as `observe`) is handed the observations of
each slot's valid steps as the slot is inserted (its input normalizer's data)."""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Callable, Iterator

import numpy as np
import torch

from sf_engine.algo.base import TrainingHooks, TrainResult
from sf_engine.replay.buffer import ReplayBuffer
from sf_engine.replay.layout import REPLAY_FILLED, REPLAY_INSERTED, REPLAY_SAMPLED
from sf_engine.replay.rate_limiter import RateLimiter
from sf_engine.replay.transform import ReplayTransform, SlotSteps
from sf_engine.roles.sources import SourceFigures, in_fill_order, lag_figures
from sf_engine.runtime.device_slots import settle
from sf_engine.runtime.transfer import to_device
from sf_engine.stats.messages import ReplayStatus
from sf_engine.stats.stages import LearnerStage, StageTimer

CHUNK_SEC = 0.05  # the longest run of updates between two publications of the weights
REPORT_SEC = 1.0  # before learning starts: how often the buffer's figures are reported
REPLAY_FILE = "replay.npz"  # --save_replay: the buffer beside the checkpoints
TRAINABLE, NOT_TRAINABLE, SKIPPED = range(3)  # the books of the env steps inserted


class InsertBooks:
    """The env steps each learner rank inserted into its buffer and those reported in a Training message, over
    SharedBuffers.replay_books [inserted: ranks x 3 | reported: ranks x 3 | number of the last report]. Each rank
    writes its own inserted row; rank 0 alone reports every rank's books (a snapshot of the rows, minus what was
    reported), then writes what it reported and counts the report in one write. A learner killed between a report and
    that write leaves both as they were, and its successor sends those books again, with what was inserted since,
    under the same number: RunStats counts the difference (sf_engine.stats.books.ReplayReports)."""

    def __init__(self, array, rank: int, ranks: int):
        self.array, self.rank, self.ranks = array, rank, ranks
        self.inserted = array[: 3 * ranks].reshape(ranks, 3)
        self.snapshot = self.inserted.copy()

    def add(self, trainable: int, not_trainable: int, skipped: int) -> None:
        self.inserted[self.rank] += (trainable, not_trainable, skipped)

    def unreported(self) -> np.ndarray:
        """[3] every rank's env steps inserted and not reported (rank 0; the others report none: zeros)."""
        if self.rank:
            return np.zeros(3, np.int64)
        self.snapshot = self.inserted.copy()
        return (self.snapshot - self.array[3 * self.ranks : 6 * self.ranks].reshape(self.ranks, 3)).sum(0)

    @property
    def number(self) -> int:
        """The number of the last report."""
        return int(self.array[-1])

    def reported(self, number: int) -> None:
        """The books of the last `unreported` went out in report `number` (rank 0)."""
        if self.rank == 0:
            self.array[3 * self.ranks :] = np.append(self.snapshot.reshape(-1), number)


class ReplaySource:
    def __init__(
        self,
        cfg,
        pool,
        buffers,
        slot_obs: dict,
        arrays: dict,
        transform: ReplayTransform,
        device,
        timer: StageTimer,
        hooks: TrainingHooks,
        seed: int,
        discrete: bool,
        observe: Callable | None = None,
        rank: int = 0,
        ends_round: Callable[[bool], bool] | None = None,
    ):
        """`pool`: the run's SlotPool; `buffers`: its SharedBuffers (the slots, the books of what went into the
        buffer); `slot_obs`: key -> the slots' observations; `arrays`: name -> the replay buffer's arrays (in device
        mode its observations on the GPU); `transform`: the algorithm's; `timer`: the learner's stage timer;
        `hooks`: the learner's (a stopping run, the env steps and seconds of the budget); `seed`: the buffer's
        sampling stream; `discrete`: the env's actions are one Discrete; `observe`: the algorithm's, or None.
        With --num_learners N: `rank`, whose buffer `arrays` is, filled with its 1/N share of the slots, trained in
        minibatches of --batch_size / N, learning once it holds --learning_starts / N env steps (so that the ranks
        together keep the run's ratio); `ends_round(over)`, asked at every minibatch with whether this rank's
        CHUNK_SEC is over, says whether the round ends (the ranks agree). Without: the chunk's end or a stop."""
        self.cfg, self.rcfg = cfg, cfg.replay
        self.pool, self.buffers, self.slot_obs, self.device = pool, buffers, slot_obs, device
        self.timer, self.hooks, self.discrete, self.observe = timer, hooks, discrete, observe
        r, ranks = self.rcfg, cfg.parallel.num_learners
        self.transform = transform
        self.buffer = ReplayBuffer(arrays, transform, r.prioritized, r.per_alpha, seed=seed)
        self.batch_size, self.slots_per_batch = cfg.minibatch // ranks, cfg.slots_per_batch // ranks
        self.limiter = RateLimiter(
            self.buffer.counters,
            r.replay_ratio,
            r.learning_starts // ranks,
            self.batch_size * transform.steps_per_sample,
        )
        self.ends_round = ends_round or (lambda over: over or hooks.stopping())
        self.ranks, self.rank = ranks, rank
        self.observed: list = []  # with several ranks: the observations inserted since the last round (limit_round)
        self.round_limit = math.inf  # with ranks, the minibatches of the round they agreed on (`ready_batches`)
        self.sync = cfg.run.mode == "sync"
        self.pending: list = []  # full slots taken, not all of --slots_per_batch yet
        self.held: list = []  # sync mode: the round's slots, inserted, freed after its training
        self.slots: list = []  # the round's slots for rank 0 to put back with several ranks: none (freed here)
        self.sample = None  # the minibatch handed out last, and the policy lag of those trained this round
        self.ages: list = []
        self.learner_waited_sec = 0.0  # waiting for full slots while the ratio allowed no training
        # env steps inserted and not yet reported, in the shared memory: a learner killed between an insert and its
        # report leaves them to the one restarted after it
        self.books = InsertBooks(buffers.replay_books, rank, ranks)
        self.last_report = time.monotonic()

    def take(self, timeout_sec: float) -> bool:
        """True while the ratio allows training; else full slots inserted (and freed, in async mode)."""
        if self.limiter.can_train():
            return True
        if self.held:  # sync: the round is trained; its slots go back now
            self.pool.recycle(self.held)
            self.held = []
        started = time.monotonic()
        needed = self.slots_per_batch - len(self.pending)
        self.timer.start()
        self.pending += self.pool.take_full(needed, timeout_sec)
        self.timer.lap(LearnerStage.WAIT_DATA)
        self.learner_waited_sec += time.monotonic() - started  # for full slots, with the ratio allowing no training
        if len(self.pending) < self.slots_per_batch:
            return False
        slots, self.pending = in_fill_order(self.buffers, self.pending, self.cfg.run.deterministic), []
        self.hold(slots)
        return False

    def hold(self, slots: list) -> None:
        """Full slots copied into the buffer; freed now in async mode, after the round's training in sync mode."""
        for slot in slots:
            self._insert(slot)
        for array in self.slot_obs.values():
            settle(array)  # copied in before the slots go back
        self.timer.lap(LearnerStage.BATCH_ASSEMBLY)
        if self.sync:
            self.held += slots
        else:
            self.pool.recycle(slots)

    def ready_batches(self) -> int:
        """The minibatches the ratio allows now."""
        return self.limiter.batches()

    def limit_round(self, batches: int) -> None:
        """With several ranks, on every rank alike before each round: its minibatches, and the observations inserted
        since the last round handed to the algorithm's `observe` at once (its normalizer merges every rank's, a
        collective: inserts come on each rank in its own time)."""
        self.round_limit = batches
        if self.observe is not None:
            self.observe(_joined(self.observed, self.slot_obs))
            self.observed = []

    def batches(self, policy) -> Iterator:
        """Minibatches while the ratio allows one (at most `round_limit`), for at most CHUNK_SEC."""
        self.ages = []
        beta = self._beta() if self.rcfg.prioritized else 1.0
        # --deterministic: the round ends where the ratio does, not where the clock does (the same publications)
        deadline = math.inf if self.cfg.run.deterministic else time.perf_counter() + CHUNK_SEC
        steps = 0
        # the learner's hooks: a stopping run ends the round, except under --deterministic (trained whole)
        while steps < self.round_limit and self.limiter.can_train():
            if self.ends_round(time.perf_counter() >= deadline):
                return
            steps += 1
            self.sample = self.buffer.sample(self.batch_size, beta)
            yield self.transform.batch(self.sample, self._tensor, self.discrete)

    def trained(self, policy, batch, result: TrainResult) -> None:
        """The minibatch's new priorities (not after a skipped update: its TD errors say nothing of its
        transitions), the limiter's count, the policy lag of its samples."""
        sample = self.sample
        if result.updates:
            self.buffer.update_priorities(sample.indices, result.priorities.cpu().numpy())
        self.limiter.trained(len(sample.indices) * self.transform.steps_per_sample)
        self.ages.append(policy.version - sample.policy_version.reshape(-1))

    def figures(self, policy, total: TrainResult) -> SourceFigures:
        ages = np.concatenate(self.ages) if self.ages and total.samples else np.zeros(0)
        return self._books(lag_figures(ages))

    def books_due(self, finishing: bool = False) -> SourceFigures | None:
        """While the buffer fills up (no training yet), every REPORT_SEC; at the stop, what is booked."""
        filling = not self.limiter.started and time.monotonic() - self.last_report > REPORT_SEC
        if not (filling or finishing):
            return None
        figures = self._books({})
        return figures if filling or figures.inserted or figures.not_trainable or figures.skipped_non_finite else None

    def reported(self, figures: SourceFigures) -> None:
        """The books of `figures` reported (InsertBooks.reported)."""
        self.books.reported(figures.report_number)
        self.last_report = time.monotonic()

    def release(self) -> None:
        pass

    def _insert(self, slot: int) -> None:
        """Copy one full slot into the buffer; its steps that may not be trained (reset steps, absent agents,
        skipped non-finite steps) are booked apart."""
        b = self.buffers
        valid, non_finite = b.valid[slot], b.non_finite[slot]
        self.buffer.insert(
            SlotSteps(
                {key: array[slot] for key, array in self.slot_obs.items()},
                b.actions[slot],
                b.rewards[slot],
                b.terminated[slot],
                b.truncated[slot],
                valid,
                b.policy_version[slot],
                *((b.rnn_states[slot], b.episode_start[slot]) if b.rnn_states is not None else ()),
            )
        )
        if self.observe is not None:  # each trainable step's observation once, as inserted
            rows = {key: _rows(array[slot][:-1], valid) for key, array in self.slot_obs.items()}
            if self.cfg.parallel.learner_world > 1:
                self.observed.append(rows)
            else:
                self.observe(rows)
        b.take_rows([slot])  # inserted: out of the books of steps not trained yet
        skipped = int(non_finite.sum())
        trainable = int(valid.sum())
        self.limiter.inserted_steps(valid.size)
        self.books.add(trainable, valid.size - trainable - skipped, skipped)

    def _tensor(self, array):
        """An array of a sample on the learner's device (the observations of a buffer on the device are there)."""
        return array.to(self.device) if isinstance(array, torch.Tensor) else to_device(array, self.device)

    def _beta(self) -> float:
        """Prioritized replay's importance exponent, annealed linearly from --per_beta to 1 over the budget."""
        used = self.cfg.run.budget_used(self.hooks.env_steps(), self.hooks.elapsed_sec())
        return self.rcfg.per_beta + (1.0 - self.rcfg.per_beta) * used

    def _books(self, lags: dict) -> SourceFigures:
        """The books of the steps inserted and not reported yet (every rank's, by rank 0), the next report's number
        and the buffer's status; `lags`: the lag figures of the samples trained this round (lag_figures)."""
        books, number = self.books.unreported(), self.books.number + 1
        # rank 0: every rank's buffer, read from the shared memory (the ranks' ratios are the same)
        counters = [arrays["counters"] for arrays in self.buffers.replay] if self.rank == 0 else [self.buffer.counters]
        return SourceFigures(
            not_trainable=int(books[NOT_TRAINABLE]),
            skipped_non_finite=int(books[SKIPPED]),
            acted=int(books[TRAINABLE]),
            inserted=int(books[TRAINABLE]),
            report_number=number,
            replay=ReplayStatus(
                inserted=sum(int(c[REPLAY_INSERTED]) for c in counters),
                sampled=sum(int(c[REPLAY_SAMPLED]) for c in counters),
                stored=sum(int(c[REPLAY_FILLED]) for c in counters) * self.buffer.rollout,
                capacity=self.buffer.capacity * len(counters),
                replay_ratio=self.limiter.replay_ratio(),
                replay_ratio_target=self.rcfg.replay_ratio,
                learning_starts=self.rcfg.learning_starts,
                age_mean=lags.get("lag_mean", 0.0),
                age_max=lags.get("lag_max", 0.0),
                learner_waited_sec=self.learner_waited_sec,
            ),
            **lags,
        )

    # --- --save_replay ----------------------------------------------------------------------------------------
    def save(self, checkpoint_dir: str) -> None:
        """--save_replay: the buffer beside the checkpoint just written (atomically); on a full disk the previous
        file stays."""
        if not self.rcfg.save_replay:
            return
        path = os.path.join(checkpoint_dir, REPLAY_FILE)
        started = time.monotonic()
        try:
            self.buffer.save(path)
        except OSError as exc:
            logging.warning("replay buffer not written (%s); the previous one is kept", exc.strerror or exc)
            return
        logging.debug("replay buffer written to %s in %.1f s", path, time.monotonic() - started)

    def load(self, checkpoint_dir: str) -> None:
        """A resumed run with --save_replay refills from the saved buffer, when there is one that fits."""
        path = os.path.join(checkpoint_dir, REPLAY_FILE)
        if not os.path.exists(path):
            logging.info("no saved replay buffer in %s: it refills from the envs", checkpoint_dir)
            return
        try:
            logging.info(self.buffer.load(path))
            self.limiter.rebase()
        except Exception as exc:  # a torn or foreign file: start empty rather than fail the run
            logging.warning("replay buffer %s not loaded (%s): it refills from the envs", path, exc)


def _joined(observed: list, slot_obs: dict) -> dict:
    """key -> the rows of every dict of `observed` (rows [n, *shape] of the slots' observations) in one array; none:
    zero rows."""
    if not observed:
        return {key: array[0, 0, :0] for key, array in slot_obs.items()}
    return {key: np.concatenate([rows[key] for rows in observed]) for key in slot_obs}


def _rows(array, mask: np.ndarray):
    """array[mask] (a bool [T, E] over its first two axes): a NumPy array's, or a tensor's on its device."""
    return array[mask] if isinstance(array, np.ndarray) else array[torch.as_tensor(mask, device=array.device)]
