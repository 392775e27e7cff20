"""Learner: one loop over a data source, each policy's algorithm trained on its batches, its weights published.

Runs in the learner process (or the runner in serial mode) on the run's device. Its data source is the one its
algorithm's spec learns from (sf_engine.roles.sources): whole trajectory slots (`slots_per_batch` slots, i.e.
T = rollout steps x N = slots x envs per split trajectories, gathered into a TrajectoryBatch) or minibatches of a
replay buffer. Each policy of the run (one unless --num_policies) has its own learning algorithm (--algo,
sf_engine.algo.base.Algorithm: PPO by default) and trains on the samples it acted (`policy_id`); a row changes
hands only at the first observation of an episode (or while its agent is absent), where the advantage recursion
is cut anyway, so each policy's targets are those of its own trajectories. After a policy's batches of a round
its new weights are copied into its shared tensor under the seqlock and its version is bumped; only then does
the source free what the round held. At most every KEEP_EVERY_SEC, after a round, the whole training state (what a
checkpoint holds) is kept in a file beside the run's shared memory: a learner restarted after this one died goes on
from it as if nothing had happened. With --num_learners N, N such processes (ranks: the role's index) train the one
policy data-parallel (sf_engine.roles.learner_ranks); rank 0 alone publishes, keeps, saves and reports.
"""

from __future__ import annotations

import logging
import os
import time

import torch

from sf_engine.algo.base import TrainingHooks, TrainResult, all_finite
from sf_engine.config.algorithms import import_class
from sf_engine.config.parallel import node_seed
from sf_engine.replay.transform import replay_transform
from sf_engine.roles.learner_ranks import LearnerRanks
from sf_engine.roles.learner_recovery import recover, resume_from
from sf_engine.roles.learning_policy import LearningPolicy
from sf_engine.roles.population import Population
from sf_engine.roles.replay_source import ReplaySource
from sf_engine.roles.sources import DataSource, TrajectorySource
from sf_engine.runtime.checkpoint import (
    population_state,
    save_checkpoint,
    save_state_atomic,
)
from sf_engine.runtime.device_slots import slot_obs_arrays
from sf_engine.runtime.rendezvous import NodeGroupsStopped
from sf_engine.runtime.role import RoleContext
from sf_engine.runtime.shared_buffers import OTHER_GROUP_STOPPED, TRAINING_STATE_SUFFIX
from sf_engine.runtime.slot_pool import SlotPool
from sf_engine.runtime.wiring import weight_readers
from sf_engine.stats.messages import CheckpointFailed, CheckpointWritten, Recovered, Training
from sf_engine.stats.stages import LearnerStage, StageTimer

DRAIN_WAIT_SEC = 0.1  # --deterministic in --mode sync, at the stop: how long the learner waits for a slot still due
REPLAY_SEED_OFFSET = 7_919  # the replay buffer's sampling stream, apart from the envs' and the networks'
KEEP_EVERY_SEC = 1.0  # the whole training state kept outside the learner's process at most this often


class Learner:
    def __init__(self, ctx: RoleContext, share: bool = True):
        """Built from the run plan (the checkpoint to resume from is the plan's); publishes version 0
        (or the resumed version) before the first step. A learner restarted after its predecessor died
        (generation > 0) starts from what that one left (`_recover`). `share`: False for a learner built
        only to write a checkpoint (checkpoint_last_published)."""
        plan = ctx.plan
        self.ctx, self.cfg, self.lcfg, self.buffers, self.queues = (
            ctx,
            plan.cfg,
            plan.cfg.learner,
            ctx.buffers,
            ctx.queues,
        )
        self.pool = SlotPool(ctx.buffers, ctx.queues)
        self.kept_path = ctx.buffers.path + TRAINING_STATE_SUFFIX
        # --num_learners: this process is rank `rank` of the policy's learner; rank 0 publishes, saves and reports
        self.rank, self.num_ranks = ctx.index, self.cfg.parallel.num_learners
        self.publishes = share and self.rank == 0
        # a learner of its own process keeps its state for its successor (a serial run's learner dies with the run)
        self.keeps = self.publishes and self.cfg.run.mode != "serial" and not self.cfg.run.sampling_only
        self.checkpoint_dir, self.env_steps_base = plan.paths.checkpoint_dir, plan.env_steps_base
        self.device = torch.device(self.cfg.parallel.learner_device(self.cfg.run.device, self.rank) if share else "cpu")
        if self.device.type == "cuda":  # this rank's GPU for whatever is made on "cuda" (its own, with ranks)
            torch.cuda.set_device(self.device)
        torch.manual_seed(self.cfg.env.seed % 2**63)  # any integer --seed: torch takes 64 bits
        self.ranks: LearnerRanks | None = None  # several ranks: this one's view of them
        self.hooks = hooks = self._hooks(ctx)
        algorithm = import_class(self.cfg.algorithm.learner)
        self.policies = [
            LearningPolicy(
                policy,
                algorithm(self.cfg, plan.spec, self.device, hooks),
                ctx.weights(policy),
                publishes=self.rank == 0,
            )
            for policy in range(self.cfg.policies.num_policies)
        ]
        self.population = Population(self, ctx)  # PBT and the opponent pool (sf_engine.roles.population)
        self.recovered = recover(self) if ctx.generation else None
        if plan.resume_from and not ctx.generation:
            resume_from(self, plan.resume_from)
        if share and self.cfg.parallel.learner_world > 1:
            try:
                self.ranks = LearnerRanks(self, ctx)
            except NodeGroupsStopped:  # while it joined them: it saves what it has and leaves, as at a stop
                ctx.agreed_stop, self.buffers.node_groups[0] = True, OTHER_GROUP_STOPPED
        if self.publishes:
            for learner in self.policies:
                learner.weights.create(learner.params, learner.version, weight_readers(self.cfg))
            self.population.share(weight_readers(self.cfg))
        if self.recovered and self.rank == 0:  # logged by the main process
            self.ctx.send(Recovered(self.recovered))
        self.last_save_time = self.last_keep_time = time.monotonic()
        self.timer = StageTimer(*LearnerStage, live=ctx.buffers.learner_stage if self.publishes else None)
        replay = self.cfg.uses_replay and share and not self.cfg.run.sampling_only
        self.source: DataSource = self._replay_source() if replay else self._trajectory_source()
        if replay and plan.resume_from and not ctx.generation and self.cfg.replay.save_replay:
            self.source.load(self.checkpoint_dir)

    def _hooks(self, ctx: RoleContext) -> TrainingHooks:
        """What the algorithm asks of the learner; with several ranks, the env steps and seconds they agreed on for
        the round and the stop they agree on within it."""
        return TrainingHooks(
            env_steps=lambda: self.env_steps if self.ranks is None else self.ranks.env_steps,
            beat=ctx.beat,
            # --deterministic: a round is trained whole wherever the stop finds it, its updates the same every run
            stopping=lambda: (
                (ctx.stopping and not self.cfg.run.deterministic) if self.ranks is None else self.ranks.stopping()
            ),
            elapsed_sec=lambda: self.elapsed_sec if self.ranks is None else self.ranks.elapsed_sec,
        )

    @property
    def elapsed_sec(self) -> float:
        return time.monotonic() - float(self.buffers.run_started[0])

    def _trajectory_source(self) -> TrajectorySource:
        return TrajectorySource(
            self.cfg,
            self.pool,
            self.buffers,
            slot_obs_arrays(self.ctx),
            self.device,
            self.timer,
            len(self.policies),
            self.ctx.send,
            self.cfg.slots_per_batch // self.num_ranks,
        )

    def _replay_source(self) -> ReplaySource:
        """The replay buffer over its arrays in the run's shared memory (this rank's, with several; in device mode its
        observations on the GPU), cut by the algorithm's replay transform; its sampling stream apart from the envs'
        and the networks', each rank's its own, new for each learner after a death."""
        slot_obs, arrays = slot_obs_arrays(self.ctx), self.buffers.replay[self.rank]
        device_obs = self.queues.device_obs
        if device_obs is not None:
            arrays = arrays | {f"obs.{key}": device_obs.replay for key in slot_obs}
        algorithm = self.policies[0].algorithm  # a replay run trains one policy
        return ReplaySource(
            self.cfg,
            self.pool,
            self.buffers,
            slot_obs,
            arrays,
            replay_transform(self.cfg),
            self.device,
            self.timer,
            self.hooks,
            seed=node_seed(self.cfg.parallel, self.cfg.env.seed)
            + REPLAY_SEED_OFFSET
            + self.ctx.generation * self.num_ranks
            + self.rank,
            discrete=self.ctx.plan.spec.action.kind == "discrete",
            observe=getattr(algorithm, "observe", None),
            rank=self.rank,
            ends_round=None if self.ranks is None else self.ranks.round_over,
        )

    # policy 0's model and version: a single-policy run's own
    model = property(lambda self: self.policies[0].algorithm.model)
    version = property(
        lambda self: self.policies[0].version, lambda self, value: setattr(self.policies[0], "version", value)
    )

    def describe(self) -> str:
        versions = ", ".join(str(learner.version) for learner in self.policies)
        nodes = self.ranks.group.nodes if self.ranks is not None else 1
        group = self.ranks.group if self.ranks is not None else None
        groups = f" (rank {group.rank} of {group.world} of {nodes} node groups)" if nodes > 1 else ""
        if not self.publishes:
            return f"rank {self.rank} of {self.num_ranks} on {self.device}{groups}, version(s) {versions}"
        ranks = f", rank 0 of {self.num_ranks} on {self.device}{groups}" if self.ranks is not None else ""
        return f"version(s) {versions} published, weights shared on {self.policies[0].weights.shared.device}{ranks}"

    @property
    def env_steps(self) -> int:
        return self.env_steps_base + int(self.buffers.env_steps.sum())

    def step(self, timeout_sec: float) -> None:
        """Take what the source has (waiting at most `timeout_sec`); train a round when there is one."""
        self.timer.start()
        self.timer.enter(LearnerStage.WAIT_DATA)
        self.ctx.beat()
        if self.publishes:
            for learner in self.policies:  # a restarted policy worker or evaluator needs the shared weights
                learner.weights.serve_requests()
            self.population.serve_requests()
        if self.ranks is not None:
            if self.ranks.agree_on_round(timeout_sec):
                self.train_round()
            elif self.rank == 0 and not self.ranks.ready:  # rank 0 books what every rank took in
                self._report_books(self.source.books_due())
        elif self.source.take(timeout_sec):
            self.train_round()
        else:
            self._report_books(self.source.books_due())
        self._save_when_due()

    def train_on(self, slots: list) -> None:
        """One round on `slots`, full trajectory slots already taken (a sampler node's, or a test's)."""
        self.source.hold(slots)
        self.train_round()

    def train_round(self) -> None:
        """Each policy trains on its batches of the source's round, then publishes its new version when an
        optimizer step was taken (weights with a non-finite value never are: the last published ones come
        back); then the source frees what the round held (with several ranks, rank 0 frees every rank's)."""
        for learner in self.policies:
            self.timer.enter(LearnerStage.TRAIN)
            started = time.perf_counter()
            results = []
            for batch in self.source.batches(learner):
                result = learner.algorithm.train(batch)
                self.source.trained(learner, batch, result)
                results.append(result)
            train_sec = time.perf_counter() - started
            self.timer.lap(LearnerStage.TRAIN)
            total = TrainResult.total(results) if results else TrainResult(0)
            published = learner.publish() if total.updates else True
            if self.ranks is not None and total.updates:
                self.ranks.check_same_weights("after a round")
            self.timer.lap(LearnerStage.WEIGHT_PUBLISH)
            figures = self.source.figures(learner, total)
            if self.ranks is not None:  # every rank's figures as one, reported by rank 0
                total, figures, train_sec = self.ranks.gathered(total, figures, train_sec)
            if figures is not None:
                self.population.trained(learner.policy, figures.acted)
                self._report(learner, total, train_sec, figures)
            learner.count_bad_updates(total, published, self.lcfg.max_bad_updates, self.checkpoint_dir)
        self._report_books(self.source.books_due())  # a batch no policy trained on: its books still count
        self.population.step()  # a PBT round or a pool snapshot when one is due
        if self.ranks is None:
            self.source.release()
        else:
            self.ranks.release_round()
        self._keep_when_due()

    def _report(self, learner: LearningPolicy, result: TrainResult, train_sec: float, figures) -> None:
        """The Training message of `learner`'s part of a round (`result`: what its algorithm trained; `figures`: what
        the source says of it, SourceFigures), then the replay buffer's status where there is one; from rank 0 only
        with several ranks (the figures of all of them)."""
        if self.rank:
            self.source.reported(figures)
            return
        self.ctx.send(
            Training(
                self.timer.report("learner"),
                version=learner.version,
                samples=result.samples,
                dropped_lag=figures.dropped_lag,
                not_trainable=figures.not_trainable,
                lag_count=figures.lag_count,
                lag_min=figures.lag_min,
                lag_mean=figures.lag_mean,
                lag_max=figures.lag_max,
                learning_rate=learner.algorithm.learning_rate,
                losses=result.losses,
                policy=learner.policy,
                train_sec=train_sec,
                skipped_non_finite=figures.skipped_non_finite,
                skipped_updates=result.skipped_updates,
                inserted=figures.inserted,
                report_number=figures.report_number,
            )
        )
        if figures.replay is not None:
            self.ctx.send(figures.replay)
        self.source.reported(figures)

    def _report_books(self, figures) -> None:
        """The source's books of steps taken in and not reported yet (None: none due), as policy 0's report."""
        if figures is not None:
            self._report(self.policies[0], TrainResult(0), 0.0, figures)

    def _keep_when_due(self) -> None:
        """The whole training state (training_state) into the file beside the run's shared memory, at most every
        KEEP_EVERY_SEC, written atomically (a reader finds the one before or this one); not while a policy's last
        updates were not finite (as checkpoints)."""
        if not self.keeps or time.monotonic() - self.last_keep_time < KEEP_EVERY_SEC or self._unsafe():
            return
        self.last_keep_time = self.timer.start()
        self.timer.enter(LearnerStage.CHECKPOINT)
        try:
            save_state_atomic(self.kept_path, self.training_state() | {"kept_at": time.time()}, durable=False)
        except OSError as exc:  # a full --shm_dir: the run goes on, its checkpoints still written
            self.keeps = False
            logging.warning(
                "the learner's training state is no longer kept in %s (%s): a restarted learner goes on from the "
                "last checkpoint and the weights published last",
                os.path.dirname(self.kept_path),
                exc.strerror or exc,
            )
        self.timer.lap(LearnerStage.CHECKPOINT)

    def training_state(self) -> dict:
        """What the learner needs to go on: each policy's algorithm state (its spec's `state()`: weights, every
        optimizer's moments, targets, ...) with its version, and PBT's and the opponent pool's state."""
        state = population_state(
            [learner.algorithm.state() | {"version": learner.version} for learner in self.policies]
        )
        return state | self.population.state()

    def _unsafe(self) -> list:
        """The policies whose weights hold a non-finite value or whose last updates were not finite."""
        return [p.policy for p in self.policies if p.bad_updates or not all_finite(p.params)]

    def _save_when_due(self) -> None:
        if not self.publishes or self.cfg.run.sampling_only:
            return
        if time.monotonic() - self.last_save_time > self.cfg.run.save_every_sec:
            self.timer.start()
            self.timer.enter(LearnerStage.CHECKPOINT)
            self.save()
            self.timer.lap(LearnerStage.CHECKPOINT)

    def finish(self) -> None:
        """The run stops: a last checkpoint (and what the source booked and has not reported). --deterministic in
        --mode sync: the sampling has stopped at the end of a round (slot_pool.deterministic_rounds), which is
        trained first, as it would be in any run of the same seed."""
        if self.cfg.run.deterministic and self.cfg.run.mode == "sync":
            self._train_what_is_left()
        if self.rank == 0:  # every rank's books (with several, a share of slots held at the stop is in flight)
            self._report_books(self.source.books_due(finishing=True))
        if not self.cfg.run.sampling_only and self.rank == 0:
            self.save()

    def _train_what_is_left(self) -> None:
        """Every full slot handed over trained on as the loop would: until the source twice has nothing."""
        idle = 0
        while idle < 2:
            self.ctx.beat()
            if self.source.take(DRAIN_WAIT_SEC):
                self.train_round()
                idle = 0
            else:
                idle += 1

    def close(self) -> None:
        if self.ranks is not None:
            self.ranks.close()

    def save(self):
        """Write a checkpoint; on a full disk (or any OSError) keep the previous one, warn, and go on. Not
        while a policy's weights hold a non-finite value or its last updates were not finite (those weights
        may be what made them so): the previous checkpoint is kept. Returns the path, or None when the
        write failed or was not made."""
        self.last_save_time = time.monotonic()
        unsafe = self._unsafe()
        if unsafe:
            logging.warning(
                "checkpoint not written: the last updates of policy %s were not finite; the previous one is kept",
                ", ".join(map(str, unsafe)),
            )
            return None
        env_steps = self.env_steps  # one reading for the file's contents and its name
        state = self.training_state() | {"env_steps": env_steps, "config": self.cfg.to_dict()}
        version = state["version"]
        try:
            path = save_checkpoint(self.checkpoint_dir, state, version, env_steps, self.cfg.run.keep_checkpoints)
        except OSError as exc:
            logging.warning(
                "checkpoint of version %d not written (%s); the previous one is kept", version, exc.strerror or exc
            )
            self.ctx.send(CheckpointFailed(str(exc.strerror or exc)))
            return None
        self.ctx.send(CheckpointWritten(path))
        self.source.save(self.checkpoint_dir)
        self.population.saved()
        return path


def checkpoint_last_published(ctx: RoleContext):
    """The run stops while its learner is dead (its restarts spent): a checkpoint of what it left (the training
    state it kept, else the weights it published last with the optimizer state of its last checkpoint), written from
    this process so that the next run resumes from it. Returns its path, or None when nothing newer than the last
    checkpoint was kept or published, or the write failed."""
    learner = Learner(ctx, share=False)
    return learner.save() if learner.newer_than_checkpoint else None
