"""The supervisor of async and sync runs: starts one process per role (sf_engine.runtime.wiring.roles_of), watches
their heartbeats, restarts failed workers (recycling the trajectory slots they were filling), and stops
everything at the end. Runs in the main process; serial mode (sf_engine.run.serial) needs none of this.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import time
from collections import deque
from dataclasses import dataclass

from sf_engine.envs import reap_orphaned_processes
from sf_engine.runtime.checkpoint import latest_valid_checkpoint, remove_temporary_files
from sf_engine.runtime.device_slots import queues_for
from sf_engine.runtime.ipc import drain_into
from sf_engine.runtime.role import RUN_STOPPED_EXIT, run_role
from sf_engine.runtime.shared_buffers import GROUP_RUNNING, LEARNING, RENDEZVOUS_SUFFIX, WRITING
from sf_engine.runtime.slot_pool import SlotPool
from sf_engine.runtime.weights import SharedWeights
from sf_engine.runtime.wiring import (
    LAST_STOP_PHASE,
    ROLES,
    heartbeat_index,
    new_policy_requests,
    policy_worker_of,
    roles_of,
)

STOP_TIMEOUT_SEC = 9.0  # every child stops within this (the learner saves first), or is killed
LEARNER_STOP_SEC = 4.0  # of which the learner's last checkpoint, once the sampling stopped, has at least this
STARTUP_GRACE_SEC = 120.0  # a process that has not beaten yet is stuck only after this (or the timeout)
RESTART_WINDOW_SEC = 300.0  # --max_worker_restarts counts restarts within this window
MAX_EVALUATOR_RESTARTS = 3  # then evaluation is off for the rest of the run


class ChildFailed(RuntimeError):
    """A child process failed in a way the run cannot go on from."""


@dataclass
class Child:
    process: object
    started: float
    generation: int


class Supervisor:
    def __init__(self, plan, experiment, mp_context, buffers, queues, stats):
        self.plan, self.cfg, self.experiment, self.mp_context = plan, plan.cfg, experiment, mp_context
        self.buffers, self.queues, self.stats = buffers, queues, stats
        self.pool = SlotPool(buffers, queues)
        self.children: dict = {}  # (role, index) -> Child
        self.restart_times: deque = deque()
        self.learner_published_at_restart = None  # param_seq when the learner was last restarted

    def start(self) -> None:
        self._remove_rendezvous()
        for role, index in roles_of(self.cfg):
            self._spawn(role, index)
        self._write_processes()

    def _remove_rendezvous(self) -> None:
        """The learner ranks' rendezvous file of ranks before (--num_learners): new ranks meet in a new one."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.buffers.path + RENDEZVOUS_SUFFIX)

    def step(self) -> None:
        """Replace the children that died or are stuck (past the restart budget: ChildFailed)."""
        for (role, index), child in list(self.children.items()):
            cause = self._failure(role, index, child)
            if cause:
                self._recover(role, index, cause)
                return  # a recovery may replace other children too: look again at the new set next time

    def _spawn(self, role: str, index: int = 0, generation: int = 0) -> None:
        self.buffers.heartbeat[heartbeat_index(role, index, self.cfg.parallel.num_learners)] = 0.0  # not beaten yet
        process = self.mp_context.Process(
            target=run_role,
            args=(role, index, generation, self.plan, queues_for(role, self.queues)),
            name=f"{role}_{index}",
            daemon=True,
        )
        process.start()
        self.children[(role, index)] = Child(process, time.monotonic(), generation)

    def _failure(self, role: str, index: int, child: Child):
        """Why this child must be replaced (died, or stuck past --stuck_timeout_sec), or None."""
        code = child.process.exitcode
        if code == 0 and role == "learner" and self.buffers.node_groups[0] != GROUP_RUNNING:
            return None  # the node groups' learner ranks stopped together: the runner stops this node group next
        if code is not None:
            return f"died ({_describe_exit(code)})"
        entry = heartbeat_index(role, index, self.cfg.parallel.num_learners)
        now, beat = time.monotonic(), float(self.buffers.heartbeat[entry])
        timeout = self.cfg.run.stuck_timeout_sec
        if beat > 0 and now - beat > timeout:
            return f"stuck (no heartbeat for {now - beat:.0f} s > --stuck_timeout_sec {timeout:g})"
        if beat == 0 and now - child.started > max(timeout, STARTUP_GRACE_SEC):
            return f"stuck while starting ({now - child.started:.0f} s)"
        return None

    def _recover(self, role: str, index: int, cause: str) -> None:
        """Restart a failed process: what it held goes back (its slots, booked as dropped), its successor
        gets the shared weights; past --max_worker_restarts within RESTART_WINDOW_SEC the run stops
        (ChildFailed), what a dead learner left first written as a checkpoint."""
        drain_into(self.queues.stats, self.stats.consume)  # the failed process's traceback, if it sent one
        trace = self.stats.faults.pop((role, index), None)
        where = f"{role.replace('_', ' ')} {index} on env {self.cfg.env.env}"
        stopped_run = self.children[(role, index)].process.exitcode == RUN_STOPPED_EXIT  # the role's own stop
        if stopped_run and role != "evaluator":
            raise ChildFailed(trace or f"{where} {cause}")
        logging.error("%s %s%s", where, cause, f":\n{trace.rstrip()}" if trace else "")
        if role == "learner":  # with --num_learners, the other ranks too: one that died first shows why
            for rank, child in [(i, c) for (r, i), c in self.children.items() if r == "learner" and i != index]:
                other, other_trace = (
                    self._failure("learner", rank, child),
                    self.stats.faults.pop(("learner", rank), None),
                )
                logging.error(
                    "learner rank %d of the same learner %s%s",
                    rank,
                    other or "was running",
                    f":\n{other_trace.rstrip()}" if other_trace else "",
                )
        self._kill(role, index)
        generation = self.children[(role, index)].generation + 1
        if role == "learner":  # with --num_learners, every rank: they start again together
            self._restart_learner(f"{where} {cause}", generation)
        elif role == "evaluator":
            self._restart_evaluator(generation, stopped_run)
        else:
            self._count_restart(f"{where} {cause}")
            self._restart_sampling(role, index, generation)
        self._write_processes()

    def _restart_evaluator(self, generation: int, stopped_run: bool) -> None:
        """Evaluation never stops training: a failed evaluator is restarted, outside --max_worker_restarts;
        one that stopped on bad input, or failed MAX_EVALUATOR_RESTARTS times, is not, and evaluation is off."""
        if stopped_run or self.stats.evaluator_restarts >= MAX_EVALUATOR_RESTARTS:
            del self.children[("evaluator", 0)]
            logging.warning("evaluation is off for the rest of this run; training goes on")
            return
        SharedWeights(self.buffers, self.queues.weights, 0).want("evaluator")
        self._spawn("evaluator", 0, generation)
        self.stats.evaluator_restarts += 1
        logging.warning("restarted the evaluator (its best evaluation so far is read back from best.pt)")

    def _restart_learner(self, what: str, generation: int) -> None:
        """A learner that died is replaced by one that starts from the newest of its last checkpoint and
        the weights it published last (sf_engine.roles.learner_recovery.recover); the slots it was training
        on are dropped (booked). With the restarts spent, what it published last becomes a checkpoint."""
        ranks = [index for role, index in self.children if role == "learner"]
        for rank in ranks:
            self._kill("learner", rank)
        self.stats.books.dropped_faults += self.pool.recycle(self.pool.owned_by([LEARNING]))
        for policy in range(self.cfg.policies.num_acting):  # its vectors died with it: readers keep their copies
            SharedWeights(self.buffers, self.queues.weights, policy).retire()
        published = self.buffers.param_seq.copy()
        try:
            if self.learner_published_at_restart is not None and (published == self.learner_published_at_restart).all():
                raise ChildFailed(f"the learner failed again before publishing anything ({what})")
            self._count_restart(what)
        except ChildFailed as exc:
            for rank in ranks:
                del self.children[("learner", rank)]  # saved here, not again at the stop
            raise ChildFailed(f"{exc}; {self._checkpoint_last_published(generation)}") from None
        self.learner_published_at_restart = published
        self._remove_rendezvous()
        for rank in ranks:
            self._spawn("learner", rank, generation)
        self.stats.learner_restarts += 1
        logging.warning(
            "restarted the learner (%d learner restarts): it resumes from the newest of its last checkpoint and "
            "the weights it published last",
            self.stats.learner_restarts,
        )

    def _checkpoint_last_published(self, generation: int) -> str:
        """Write what the dead learner left (the training state it kept, else the weights it published last) as a
        checkpoint, from this process; says where."""
        from sf_engine.roles.learner import checkpoint_last_published
        from sf_engine.runtime.role import RoleContext

        ctx = RoleContext(self.plan, "learner", 0, self.buffers, self.queues, generation)
        try:
            path = checkpoint_last_published(ctx)
        except Exception as exc:  # the run stops anyway: say why nothing was written
            logging.exception("no checkpoint of what the learner left")
            path, why = None, f"{exc.__class__.__name__}: {exc}"
        else:
            why = "nothing newer than the last checkpoint was kept or published, or the write failed"
        if path is None:
            last, _ = latest_valid_checkpoint(self.plan.paths.checkpoint_dir)
            return f"what the learner left was not saved ({why}); the last good checkpoint is {last or 'none'}"
        return f"what the learner left was saved as {path}: run the same command again to resume from it"

    def _restart_sampling(self, role: str, index: int, generation: int) -> None:
        """A receiver, rollout worker, device sampler or policy worker replaced."""
        if role == "receiver":  # its sampler actors ended with it (it was their Ray driver): new ones start
            self.pool.recycle(self.pool.owned_by([WRITING]))  # its successor books their steps as dropped
            for policy in range(self.cfg.policies.num_acting):
                SharedWeights(self.buffers, self.queues.weights, policy).want("receiver")
            self._spawn(role, index, generation)
            logging.warning("restarted the receiver and its sampler actors")
        elif role in ("rollout_worker", "device_sampler"):
            if role == "device_sampler":  # its acting network reads the weights: the vector goes to the new one
                SharedWeights(self.buffers, self.queues.weights, 0).want(role)
            self._restart_workers([index], role)
            self.stats.worker_restarts += 1
            logging.warning(
                "restarted %s %d with fresh envs (%d worker restarts)",
                role.replace("_", " "),
                index,
                self.stats.worker_restarts,
            )
        else:  # policy worker: its pending requests are gone, so the rollout workers it served start over too
            workers = [w for r, w in self.children if r == "rollout_worker" and policy_worker_of(w, self.cfg) == index]
            for w in workers:
                self._kill("rollout_worker", w)
            # the dead policy worker may have broken its queue (see ipc): the new processes get a new one
            requests = list(self.queues.policy_requests)
            requests[index] = new_policy_requests()
            self.queues = dataclasses.replace(self.queues, policy_requests=requests)
            for policy in range(self.cfg.policies.num_acting):
                SharedWeights(self.buffers, self.queues.weights, policy).want("policy_worker")
            self._spawn(role, index)
            self._restart_workers(workers)
            self.stats.policy_worker_restarts += 1
            logging.warning(
                "restarted policy worker %d (weights from the shared copy) and the rollout workers it serves", index
            )

    def _count_restart(self, what: str) -> None:
        now = time.monotonic()
        self.restart_times.append(now)
        while now - self.restart_times[0] > RESTART_WINDOW_SEC:
            self.restart_times.popleft()
        if len(self.restart_times) > self.cfg.run.max_worker_restarts:
            raise ChildFailed(
                f"{len(self.restart_times)} process failures within {RESTART_WINDOW_SEC:.0f} s (last: "
                f"{what}); fix the cause or raise --max_worker_restarts"
            )

    def _restart_workers(self, workers: list, role: str = "rollout_worker") -> None:
        """Rollout workers (or device samplers) start over with fresh envs and new seeds; the slots their dead
        predecessors were filling go back to the free pool and their env steps are dropped (counted), so no
        half-filled trajectory is trained on."""
        self.stats.books.dropped_faults += self.pool.recycle(self.pool.owned_by(workers))
        for line in reap_orphaned_processes():  # what the dead workers' envs ran outside them
            logging.info(line)
        for w in workers:
            self._spawn(role, w, self.children[(role, w)].generation + 1)

    def _kill(self, role: str, index: int) -> None:
        process = self.children[(role, index)].process
        if process.is_alive():
            process.kill()
        process.join(timeout=5.0)

    def _write_processes(self) -> None:
        self.experiment.write_processes(
            [
                (role, index, child.process.pid)
                for (role, index), child in self.children.items()
                if child.process.is_alive()
            ]
        )

    def shutdown(self) -> None:
        """Stop every child within STOP_TIMEOUT_SEC (the learner saves a checkpoint first) and kill what
        does not stop. A second Ctrl-C kills the children at once (checkpoints are written atomically,
        so none is corrupted)."""
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C: kill them now
        try:
            deadline = time.monotonic() + STOP_TIMEOUT_SEC
            for phase in range(1, LAST_STOP_PHASE + 1):  # the sampling stops, then the learner saves what it made
                self.buffers.stop[0] = phase
                phase_end = deadline - (LAST_STOP_PHASE - phase) * LEARNER_STOP_SEC
                for (role, _), child in self.children.items():
                    if ROLES[role].stop_phase == phase:
                        child.process.join(timeout=max(0.0, phase_end - time.monotonic()))
        except KeyboardInterrupt:
            logging.info("second Ctrl-C: stopping every process now")
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a third: the stop goes on to its end
            for (role, index), child in self.children.items():
                if child.process.is_alive():
                    logging.warning("%s %d did not stop in time: killed", role, index)
                    child.process.kill()
                    child.process.join(timeout=5.0)
            learner = self.children.get(("learner", 0))
            if learner is not None and learner.process.exitcode not in (0, RUN_STOPPED_EXIT):
                logging.warning(
                    "the learner did not save at the stop: %s", self._checkpoint_last_published(learner.generation + 1)
                )
            if self.children:
                self.children = {}
                self._write_processes()
            for line in reap_orphaned_processes():  # the envs' own processes of workers killed just now
                logging.info(line)
            remove_temporary_files(self.plan.paths.checkpoint_dir)  # a learner killed while it saved


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
