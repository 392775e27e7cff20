"""Learner: gathers whole trajectory slots, hands each policy's algorithm its part, publishes weights.

Runs in the learner process (or the runner in serial mode) on the run's device. A training batch is
`slots_per_batch` slots, i.e. T = rollout steps x N = slots x envs per split trajectories, gathered
into a TrajectoryBatch (sf_engine.algo.batch). Each policy of the run (one unless --num_policies) has
its own learning algorithm (--algo, sf_engine.algo.base.Algorithm: PPO by default) and trains on the
samples it acted in the batch (`policy_id`); a row changes hands only at the first observation of an
episode (or while its agent is absent), where the advantage recursion is cut anyway, so each policy's
targets are those of its own trajectories. After its update a policy's new weights are copied into its
shared tensor under the seqlock and its version is bumped; only then are the slots returned to the free
pool (so in sync mode no slot is ever filled by an older policy).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from sf_engine.algo.base import Algorithm, TrainingHooks
from sf_engine.algo.batch import SLOT_FIELDS, TrajectoryBatch
from sf_engine.config.groups import ALGORITHMS
from sf_engine.roles.population import Population
from sf_engine.runtime.checkpoint import load_checkpoint, policy_states, population_state, save_checkpoint
from sf_engine.runtime.ipc import get_many
from sf_engine.runtime.role import RoleContext
from sf_engine.runtime.slot_pool import SlotPool
from sf_engine.runtime.weights import SharedWeights
from sf_engine.runtime.wiring import import_class, weight_readers
from sf_engine.stats.messages import CheckpointFailed, CheckpointWritten, Recycled, Training
from sf_engine.stats.stages import LearnerStage, StageTimer


@dataclass
class LearningPolicy:
    """One trained policy as the learner holds it: its algorithm (model, optimizer, maths), its shared
    weights, the version it published last, and the oldest version whose samples it still trains on (a
    PBT exploit replaces the weights: what the old ones acted is dropped)."""

    policy: int
    algorithm: Algorithm
    weights: SharedWeights
    version: int = 0
    min_version: int = 0

    @property
    def params(self):
        return self.algorithm.params

    def publish(self) -> None:
        """The algorithm's weights as the next version."""
        self.version += 1
        self.weights.publish(self.params, self.version)


class Learner:
    def __init__(self, ctx: RoleContext):
        """Built from the run plan (the checkpoint to resume from is the plan's); publishes version 0
        (or the resumed version) before the first step."""
        plan = ctx.plan
        self.ctx, self.cfg, self.lcfg, self.buffers, self.queues = (
            ctx,
            plan.cfg,
            plan.cfg.learner,
            ctx.buffers,
            ctx.queues,
        )
        self.pool = SlotPool(ctx.buffers, ctx.queues)
        self.checkpoint_dir, self.env_steps_base = plan.paths.checkpoint_dir, plan.env_steps_base
        self.device = torch.device(self.cfg.run.device)
        torch.manual_seed(self.cfg.env.seed % 2**63)  # any integer --seed: torch takes 64 bits
        hooks = TrainingHooks(env_steps=lambda: self.env_steps, beat=ctx.beat, stopping=lambda: ctx.stopping)
        algorithm = import_class(ALGORITHMS[self.lcfg.algo])
        self.policies = [
            LearningPolicy(policy, algorithm(self.cfg, plan.spec, self.device, hooks), ctx.weights(policy))
            for policy in range(self.cfg.policies.num_policies)
        ]
        self.population = Population(self, ctx)  # PBT and the opponent pool (sf_engine.roles.population)
        if plan.resume_from:
            self._load(plan.resume_from)
        for learner in self.policies:
            learner.weights.create(learner.params, learner.version, weight_readers(self.cfg))
        self.population.share(weight_readers(self.cfg))
        self.pending_slots: list = []
        self.last_save_time = time.monotonic()
        self.timer = StageTimer(*LearnerStage)

    # policy 0's model and version: a single-policy run's own
    model = property(lambda self: self.policies[0].algorithm.model)
    version = property(
        lambda self: self.policies[0].version, lambda self, value: setattr(self.policies[0], "version", value)
    )

    def describe(self) -> str:
        versions = ", ".join(str(learner.version) for learner in self.policies)
        return f"version(s) {versions} published, weights shared on {self.policies[0].weights.shared.device}"

    def _load(self, path: str) -> None:
        """A checkpoint of one policy or of several (sf_engine.runtime.checkpoint.policy_states)."""
        state = load_checkpoint(path, self.device)
        for learner, policy_state in zip(self.policies, policy_states(state)):
            learner.algorithm.load(policy_state, path)
            learner.version = learner.min_version = int(policy_state["version"])
            logging.info("policy %d resumed from %s (version %d)", learner.policy, path, learner.version)
        self.population.load(state)

    @property
    def env_steps(self) -> int:
        return self.env_steps_base + int(self.buffers.env_steps.sum())

    def step(self, timeout_sec: float) -> None:
        """Wait (at most `timeout_sec`) for full slots; train once a whole batch has arrived."""
        needed = self.cfg.slots_per_batch - len(self.pending_slots)
        self.timer.start()
        self.ctx.beat()
        for learner in self.policies:  # a restarted policy worker or evaluator needs the shared weights
            learner.weights.serve_requests()
        self.population.serve_requests()
        self.pending_slots += get_many(self.queues.full_slots, timeout_sec, max_messages=needed)
        self.timer.lap(LearnerStage.WAIT_DATA)
        if self.cfg.run.sampling_only:
            if self.pending_slots:
                self.ctx.send(Recycled(self.pool.recycle(self.pending_slots)))
            self.pending_slots = []
        elif len(self.pending_slots) == self.cfg.slots_per_batch:
            slots, self.pending_slots = self.pending_slots, []
            self.train_on(slots)
        if time.monotonic() - self.last_save_time > self.cfg.run.save_every_sec and not self.cfg.run.sampling_only:
            self.timer.start()
            self.save()
            self.timer.lap(LearnerStage.CHECKPOINT)

    def finish(self) -> None:
        """The run stops: a last checkpoint."""
        if not self.cfg.run.sampling_only:
            self.save()

    def close(self) -> None:
        pass

    def _gather(self, slots: list) -> TrajectoryBatch:
        """Copy the slots out of shared memory, time-major: obs[key] [T+1, N, *shape], the step fields
        [T, N, ...] (N = slots x envs per split); every field of SLOT_FIELDS the run has."""
        index = np.asarray(slots)

        def time_major(array):  # [S, R, E, ...] -> [R, S * E, ...]
            picked = array[index].swapaxes(0, 1)
            tensor = torch.from_numpy(np.ascontiguousarray(picked).reshape(picked.shape[0], -1, *picked.shape[3:]))
            return tensor.to(self.device)

        fields = {field.name: getattr(self.buffers, field.name) for field in SLOT_FIELDS}
        return TrajectoryBatch(
            obs={key: time_major(array) for key, array in self.buffers.obs.items()},
            **{name: time_major(array) for name, array in fields.items() if array is not None},
        )

    def train_on(self, slots: list) -> None:
        """One training iteration on `slots`: each policy on the samples it acted (all of them with one
        policy), then its new version published; then the slots go back to the free pool."""
        self.timer.start()
        batch = self._gather(slots)
        valid = batch.valid
        self.timer.lap(LearnerStage.BATCH_ASSEMBLY)
        not_trainable = self._not_trainable(batch)  # booked once per batch, with its first report
        for learner in self.policies:
            mine = valid if batch.policy_id is None else valid & (batch.policy_id[:-1] == learner.policy)
            if len(self.policies) > 1 and not bool(mine.any()):
                continue  # no sample of this policy in the batch: nothing to train, no new version
            lag = learner.version - batch.policy_version
            keep = mine & (lag <= self.lcfg.max_policy_lag) & (batch.policy_version >= learner.min_version)
            started = time.perf_counter()
            result = learner.algorithm.train(batch, keep)
            train_sec = time.perf_counter() - started
            self.timer.lap(LearnerStage.TRAIN)
            learner.publish()
            self.population.trained(learner.policy, int(mine.sum()))
            self.timer.lap(LearnerStage.WEIGHT_PUBLISH)
            mine_lag = lag[mine].float() if bool(mine.any()) else torch.zeros(1)
            self.ctx.send(
                Training(
                    self.timer.report("learner"),
                    version=learner.version,
                    samples=result.samples,
                    dropped_lag=int((mine & ~keep).sum()),
                    not_trainable=not_trainable,
                    lag_count=int(mine.sum()),
                    lag_min=float(mine_lag.min()),
                    lag_mean=float(mine_lag.mean()),
                    lag_max=float(mine_lag.max()),
                    learning_rate=learner.algorithm.learning_rate,
                    losses=result.losses,
                    policy=learner.policy,
                    train_sec=train_sec,
                )
            )
            not_trainable = 0
        if not_trainable:  # no policy trained on this batch: its books still count
            self.ctx.send(
                Training(
                    self.timer.report("learner"),
                    version=self.policies[0].version,
                    samples=0,
                    dropped_lag=0,
                    not_trainable=not_trainable,
                    lag_count=0,
                    lag_min=0.0,
                    lag_mean=0.0,
                    lag_max=0.0,
                    learning_rate=self.policies[0].algorithm.learning_rate,
                )
            )
        self.population.step()  # a PBT round or a pool snapshot when one is due
        self.pool.recycle(slots)
        self.timer.lap(LearnerStage.WEIGHT_PUBLISH)

    def _not_trainable(self, batch: TrajectoryBatch) -> int:
        """Reset steps and absent agents, and the steps the opponent pool's snapshots acted."""
        not_trainable = int((~batch.valid).sum())
        if batch.policy_id is not None:
            not_trainable += int((batch.valid & (batch.policy_id[:-1] >= len(self.policies))).sum())
        return not_trainable

    def save(self):
        """Write a checkpoint; on a full disk (or any OSError) keep the previous one, warn, and go on.
        Returns the path, or None when the write failed."""
        env_steps = self.env_steps  # one reading for the file's contents and its name
        state = population_state(
            [learner.algorithm.state() | {"version": learner.version} for learner in self.policies]
        )
        state |= self.population.state()
        state |= {"env_steps": env_steps, "config": self.cfg.to_dict()}
        version = state["version"]
        self.last_save_time = time.monotonic()
        try:
            path = save_checkpoint(self.checkpoint_dir, state, version, env_steps, self.cfg.run.keep_checkpoints)
        except OSError as exc:
            logging.warning(
                "checkpoint of version %d not written (%s); the previous one is kept", version, exc.strerror or exc
            )
            self.ctx.send(CheckpointFailed(str(exc.strerror or exc)))
            return None
        self.ctx.send(CheckpointWritten(path))
        return path
