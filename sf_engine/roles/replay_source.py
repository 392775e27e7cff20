"""The learner's data source with a replay buffer (an algorithm whose spec learns from replay transitions or
sequences): full trajectory slots copied into the buffer and freed, minibatches sampled out and trained on, the
replay ratio held by the rate limiter (sf_engine.roles.sources says how the learner's loop uses a source).

Runs in the learner process (or the runner in serial mode), for one policy. Each step of the learner either
takes full slots (when the ratio allows no training: learning waits for data) or trains a round: minibatches
while the ratio allows one, for at most CHUNK_SEC, then one publication of the weights. In async mode a slot is
freed as soon as it is copied in, so sampling waits only when the learner holds the next full slots back to keep
the ratio (learning is the slower side: the rollout workers' wait for a free slot says how long). In sync mode
the learner takes one slot of every split, trains what they allow, publishes, and only then frees them: every
sample is acted by the newest policy. An algorithm that has `observe` is handed the observations of each slot's
valid steps as the slot is inserted (its input normalizer's data). An algorithm whose spec learns from replay
sequences is fed sequences of --replay_sequence_length steps (sf_engine.replay.sequences) instead of
transitions; the rate limiter counts a sequence as its L steps."""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Iterator

import numpy as np
import torch

from sf_engine.algo.base import TrainResult
from sf_engine.algo.batch import ReplayBatch, SequenceBatch
from sf_engine.config.algorithms import SEQUENCES
from sf_engine.replay.buffer import ReplayBuffer, ReplaySample
from sf_engine.replay.rate_limiter import RateLimiter
from sf_engine.replay.sequences import SequenceSample, SequenceShape
from sf_engine.roles.sources import in_fill_order
from sf_engine.runtime.device_slots import settle, slot_obs_arrays
from sf_engine.runtime.transfer import to_device
from sf_engine.stats.messages import ReplayStatus, Training
from sf_engine.stats.stages import LearnerStage

CHUNK_SEC = 0.05  # the longest run of updates between two publications of the weights
REPORT_SEC = 1.0  # before learning starts: how often the buffer's figures are reported
REPLAY_FILE = "replay.npz"  # --save_replay: the buffer beside the checkpoints
REPLAY_SEED_OFFSET = 7_919  # the buffer's sampling stream, apart from the envs' and the networks'
# the books of the steps inserted and not reported yet, then the number of the last report (SharedBuffers.replay_books)
TRAINABLE, NOT_TRAINABLE, SKIPPED, REPORTED = range(4)


class ReplaySource:
    def __init__(self, learner):
        """`learner`: the Learner this source feeds (its context, slot pool, stage timer, device, policy and clock
        are read, never its data)."""
        cfg = learner.cfg
        self.ctx, self.cfg, self.rcfg = learner.ctx, cfg, cfg.replay
        self.pool, self.timer, self.buffers = learner.pool, learner.timer, learner.buffers
        self.device, self.hooks = learner.device, learner.hooks
        r = self.rcfg
        sequences = SequenceShape(r.burn_in, r.replay_sequence_length, r.n_step)
        self.policy = learner.policies[0]  # a replay run trains one policy
        algorithm = self.policy.algorithm
        self.sequences = sequences if cfg.algorithm.data == SEQUENCES else None
        self.observe = getattr(algorithm, "observe", None)  # SAC's: the observations of each slot inserted
        # the slots' observations and the buffer's: in the run's shared memory, or on a GPU in its memory (device mode)
        device_obs, arrays = learner.ctx.queues.device_obs, learner.buffers.replay
        self.slot_obs = slot_obs_arrays(learner.ctx)
        if device_obs is not None:
            arrays = arrays | {f"obs.{key}": device_obs.replay for key in self.slot_obs}
        self.buffer = ReplayBuffer(
            arrays,
            cfg.learner.gamma,
            self.rcfg.n_step,
            self.rcfg.prioritized,
            self.rcfg.per_alpha,
            seed=cfg.env.seed + REPLAY_SEED_OFFSET + learner.ctx.generation,
            sequences=self.sequences,
        )
        self.steps_per_sample = self.sequences.length if self.sequences else 1  # what the limiter counts
        self.limiter = RateLimiter(
            self.buffer.counters, r.replay_ratio, r.learning_starts, cfg.learner.batch_size * self.steps_per_sample
        )
        self.sync = cfg.run.mode == "sync"
        self.discrete = learner.ctx.plan.spec.action.kind == "discrete"  # else Box actions [B, A] float32 (SAC)
        self.pending: list = []  # full slots taken, not all of --slots_per_batch yet
        self.held: list = []  # sync mode: the round's slots, inserted, freed after its training
        self.sample = None  # the minibatch handed out last, and the policy lag of those trained this round
        self.ages: list = []
        self.learner_waited_sec = 0.0  # waiting for full slots while the ratio allowed no training
        # env steps inserted and not yet reported (TRAINABLE, NOT_TRAINABLE, SKIPPED), in the shared memory: a
        # learner killed between an insert and its report leaves them to the one restarted after it
        self.unreported = learner.buffers.replay_books
        self.last_report = time.monotonic()

    def take(self, timeout_sec: float) -> bool:
        """True while the ratio allows training; else full slots inserted (and freed, in async mode)."""
        if self.limiter.can_train():
            return True
        if self.held:  # sync: the round is trained; its slots go back now
            self.pool.recycle(self.held)
            self.held = []
        started = time.monotonic()
        needed = self.cfg.slots_per_batch - len(self.pending)
        self.timer.start()
        self.pending += self.pool.take_full(needed, timeout_sec)
        self.timer.lap(LearnerStage.WAIT_DATA)
        self.learner_waited_sec += time.monotonic() - started  # for full slots, with the ratio allowing no training
        if len(self.pending) < self.cfg.slots_per_batch:
            return False
        slots, self.pending = in_fill_order(self.buffers, self.pending, self.cfg.run.deterministic), []
        for slot in slots:
            self._insert(slot)
        for array in self.slot_obs.values():
            settle(array)  # copied in before the slots go back
        self.timer.lap(LearnerStage.BATCH_ASSEMBLY)
        if self.sync:
            self.held = slots
        else:
            self.pool.recycle(slots)
        if not self.limiter.started and time.monotonic() - self.last_report > REPORT_SEC:
            self._report(self.policy, TrainResult(0), np.zeros(0), 0.0)  # the buffer filling up
        return False

    def batches(self, policy) -> Iterator[ReplayBatch | SequenceBatch]:
        """Minibatches while the ratio allows one, for at most CHUNK_SEC."""
        self.ages = []
        beta = self._beta() if self.rcfg.prioritized else 1.0
        draw = self.buffer.sample_sequences if self.sequences else self.buffer.sample
        # --deterministic: the round ends where the ratio does, not where the clock does (the same publications)
        deadline = math.inf if self.cfg.run.deterministic else time.perf_counter() + CHUNK_SEC
        # the learner's hooks: a stopping run ends the round, except under --deterministic (trained whole)
        while self.limiter.can_train() and time.perf_counter() < deadline and not self.hooks.stopping():
            self.sample = draw(self.cfg.learner.batch_size, beta)
            yield self._batch(self.sample)

    def trained(self, policy, batch, result: TrainResult) -> None:
        """The minibatch's new priorities (not after a skipped update: its TD errors say nothing of its
        transitions), the limiter's count, the policy lag of its samples."""
        sample = self.sample
        if result.updates:
            self.buffer.update_priorities(sample.indices, result.priorities.cpu().numpy())
        self.limiter.trained(len(sample.indices) * self.steps_per_sample)
        self.ages.append(policy.version - sample.policy_version.reshape(-1))

    def report(self, policy, total: TrainResult, train_sec: float) -> None:
        self._report(policy, total, np.concatenate(self.ages) if self.ages else np.zeros(0), train_sec)

    def done(self) -> None:
        pass

    def finish(self) -> None:
        """The run stops: the books of the slots inserted since the last report go out (every env step booked)."""
        if self.unreported[:REPORTED].any():
            self._report(self.policy, TrainResult(0), np.zeros(0), 0.0)

    def _insert(self, slot: int) -> None:
        """Copy one full slot into the buffer; its steps that may not be trained (reset steps, absent agents,
        skipped non-finite steps) are booked apart."""
        b = self.buffers
        valid, non_finite = b.valid[slot], b.non_finite[slot]
        self.buffer.insert(
            {key: array[slot] for key, array in self.slot_obs.items()},
            b.actions[slot],
            b.rewards[slot],
            b.terminated[slot],
            b.truncated[slot],
            valid,
            b.policy_version[slot],
            *((b.rnn_states[slot], b.episode_start[slot]) if self.sequences else ()),
        )
        if self.observe is not None:  # each trainable step's observation once, as inserted
            self.observe({key: _rows(array[slot][:-1], valid) for key, array in self.slot_obs.items()})
        b.take_rows([slot])  # inserted: out of the books of steps not trained yet
        skipped = int(non_finite.sum())
        trainable = int(valid.sum())
        self.limiter.inserted_steps(valid.size)
        self.unreported[:REPORTED] += (trainable, valid.size - trainable - skipped, skipped)

    def _batch(self, sample: ReplaySample | SequenceSample) -> ReplayBatch | SequenceBatch:
        device = self.device

        def tensor(array):  # the observations of a buffer on the device are tensors there already
            return array.to(device) if isinstance(array, torch.Tensor) else to_device(array, device)

        if self.sequences:
            return SequenceBatch(
                obs={key: tensor(value) for key, value in sample.obs.items()},
                episode_start=tensor(sample.episode_start),
                initial_state=tensor(sample.initial_state),
                actions=tensor(sample.actions.astype(np.int64, copy=False)).reshape(sample.returns.shape),
                returns=tensor(sample.returns),
                steps=tensor(sample.steps),
                discounts=tensor(sample.discounts),
                trainable=tensor(sample.trainable),
                weights=tensor(sample.weights),
                burn_in=self.sequences.burn_in,
            )

        return ReplayBatch(
            obs={key: tensor(value) for key, value in sample.obs.items()},
            actions=tensor(sample.actions.astype(np.int64, copy=False)).reshape(-1)
            if self.discrete
            else tensor(sample.actions),
            returns=tensor(sample.returns),
            discounts=tensor(sample.discounts),
            next_obs={key: tensor(value) for key, value in sample.next_obs.items()},
            weights=tensor(sample.weights),
        )

    def _beta(self) -> float:
        """Prioritized replay's importance exponent, annealed linearly from --per_beta to 1 over the budget."""
        used = self.cfg.run.budget_used(self.hooks.env_steps(), self.hooks.elapsed_sec())
        return self.rcfg.per_beta + (1.0 - self.rcfg.per_beta) * used

    def _report(self, policy, result: TrainResult, ages: np.ndarray, train_sec: float) -> None:
        """The round's Training message and the buffer's ReplayStatus; `ages` [samples] the policy lag of the
        transitions trained on (none: no lag figures)."""
        books, number = self.unreported[:REPORTED].copy(), int(self.unreported[REPORTED]) + 1
        ages = ages if len(ages) else np.zeros(1)  # the figures below need a value; lag_count says there was none
        count = len(ages) if result.samples else 0
        self.last_report = time.monotonic()
        self.ctx.send(
            Training(
                self.timer.report("learner"),
                version=policy.version,
                samples=result.samples,
                dropped_lag=0,
                not_trainable=int(books[NOT_TRAINABLE]),
                lag_count=count,
                lag_min=float(ages.min()),
                lag_mean=float(ages.mean()),
                lag_max=float(ages.max()),
                learning_rate=policy.algorithm.learning_rate,
                losses=result.losses,
                train_sec=train_sec,
                skipped_non_finite=int(books[SKIPPED]),
                skipped_updates=result.skipped_updates,
                inserted=int(books[TRAINABLE]),
                report_number=number,
            )
        )
        # the books cleared and the report counted in one write: a death before it leaves both as they were, and
        # the next learner sends these books again, under the same number (RunStats counts the difference)
        self.unreported[:] = np.append(self.unreported[:REPORTED] - books, number)
        self.ctx.send(
            ReplayStatus(
                inserted=self.limiter.inserted,
                sampled=self.limiter.sampled,
                stored=self.buffer.size,
                capacity=self.buffer.capacity,
                replay_ratio=self.limiter.replay_ratio(),
                replay_ratio_target=self.rcfg.replay_ratio,
                learning_starts=self.rcfg.learning_starts,
                age_mean=float(ages.mean()),
                age_max=float(ages.max()),
                learner_waited_sec=self.learner_waited_sec,
            )
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


def _rows(array, mask: np.ndarray):
    """array[mask] (a bool [T, E] over its first two axes): a NumPy array's, or a tensor's on its device."""
    return array[mask] if isinstance(array, np.ndarray) else array[torch.as_tensor(mask, device=array.device)]
