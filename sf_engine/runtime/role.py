"""What every role is and shares: the Role protocol, its context (plan, shared buffers, queues, heartbeat,
stats), the one process entry that runs any role class in a child process, and the one way to step
roles in turn in this process.

A role is a plain class built as `cls(ctx)` from a RoleContext (sf_engine.runtime.wiring.ROLES says the
rest of what the plumbing needs to know of it). `run_role` is the process target of every role;
InProcessRoles builds the same classes from the same plan and steps them in one process (serial mode,
sf_engine.run.serial; a sampler node, sf_engine.scaleout.sampler_node).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import queue
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Protocol

from sf_engine.envs import EnvError
from sf_engine.runtime.ipc import ParentWatch
from sf_engine.runtime.log_file import LogFile
from sf_engine.runtime.run_plan import RunPlan
from sf_engine.runtime.shared_buffers import SharedBuffers
from sf_engine.runtime.wiring import ROLES, Queues, heartbeat_index, role_class
from sf_engine.stats import messages


class RunStopped(Exception):
    """Raised by a role to stop the whole run: its message is the one-line cause of the stop (no traceback,
    no restart)."""


class Role(Protocol):
    """A process role: built as `cls(ctx)` from a RoleContext."""

    def describe(self) -> str:
        """Its one-line ready message."""

    def step(self, timeout_sec: float) -> None:
        """One unit of work, blocking at most `timeout_sec` (0 in one process)."""

    def finish(self) -> None:
        """A clean stop: the learner's last checkpoint, the last stats."""

    def close(self) -> None:
        """Release what it holds (envs), after `finish` or a failure."""


@dataclass
class RoleContext:
    """What a role is built from: the run plan, its place (role, index, generation of a restarted
    worker), the shared buffers and the queues."""

    plan: RunPlan
    role: str
    index: int
    buffers: SharedBuffers
    queues: Queues
    generation: int = 0
    # learner ranks (--num_learners > 1): whether they agreed to stop (sf_engine.roles.learner), which `stopping`
    # says in place of the shared flag, so that every rank leaves its loop after the same round; None: one learner
    agreed_stop: bool | None = None

    @property
    def cfg(self):
        return self.plan.cfg

    @property
    def name(self) -> str:
        """'learner', 'policy_worker', 'policy_worker_1', 'rollout_worker_3', 'device_sampler_0', ..."""
        several = self.role in ("rollout_worker", "device_sampler") or (self.role == "policy_worker" and self.index)
        return f"{self.role}_{self.index}" if several else self.role

    def beat(self) -> None:
        """A sign of life (the supervisor restarts a process whose heartbeat stops)."""
        entry = heartbeat_index(self.role, self.index, self.cfg.parallel.num_learners)
        self.buffers.heartbeat[entry] = time.monotonic()

    @property
    def stopping(self) -> bool:
        """The run stops, and this role's turn to stop has come (wiring.RoleSpec.stop_phase); learner ranks: they
        agreed so."""
        return self.stop_signalled if self.agreed_stop is None else self.agreed_stop

    @property
    def stop_signalled(self) -> bool:
        """The shared stop flag has reached this role's phase."""
        return int(self.buffers.stop[0]) >= ROLES[self.role].stop_phase

    def send(self, message) -> None:
        """A stats message to the main process; dropped (never blocks) if it is far behind."""
        try:
            self.queues.stats.put(message, block=False)
        except queue.Full:
            pass

    def weights(self, policy: int = 0):
        """Policy `policy`'s shared weights, seen from this process."""
        from sf_engine.runtime.weights import SharedWeights

        return SharedWeights(self.buffers, self.queues.weights, policy)


RUN_STOPPED_EXIT = 4  # a role's exit code when it stopped the run (RunStopped): its one line is the cause


def _init_child(role: str, index: int, log_path: str) -> None:
    """The main process alone handles Ctrl-C; logs go to the run's file."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    logging.basicConfig(
        handlers=[LogFile(log_path, report=False)],
        level=logging.INFO,
        format=f"%(asctime)s {role}[{index}] %(levelname)s %(message)s",
    )


def set_torch_threads(role: str, cfg) -> None:
    """Torch threads of the process that runs `role`, and its allocator told to keep freed memory
    (sf_engine.runtime.device.keep_freed_memory); nothing for a role without torch."""
    threads = ROLES[role].torch_threads
    if threads is not None:
        import torch

        from sf_engine.runtime.device import keep_freed_memory

        torch.set_num_threads(threads(cfg))
        keep_freed_memory()


def make_reproducible(role: str, cfg) -> None:
    """--deterministic, in the process that runs `role` (one with torch; serial mode: sf_engine.run.serial): torch's
    deterministic algorithms (cuBLAS needs its fixed workspace for that, set before use), and torch's generator
    seeded from --seed and the role (the policy worker's samples actions; the learner seeds its own again)."""
    if not cfg.run.deterministic or ROLES[role].torch_threads is None:
        return
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.manual_seed((cfg.env.seed * 1_000_003 + heartbeat_index(role) + 1) % 2**63)  # any integer --seed


def pin_to_cores(role: str, cfg, index: int = 0) -> None:
    """--cpu_affinity learner: the learner runs on the last --learner_threads of the usable cores (with
    --num_learners, rank r on the r-th such group from the end), every other process on the rest, so that the
    sampler's processes never preempt the learner (and never evict its working set from the core's caches)
    while it trains."""
    if cfg.run.cpu_affinity != "learner":
        return
    cores = sorted(os.sched_getaffinity(0))
    threads, ranks = cfg.learner.learner_threads, cfg.parallel.num_learners
    if len(cores) > threads * ranks:
        own = cores[len(cores) - threads * (index + 1) : len(cores) - threads * index]
        os.sched_setaffinity(0, own if role == "learner" else cores[: len(cores) - threads * ranks])


def register_user_code(plan: RunPlan) -> None:
    """The user's code that the plan carries (register_env's factories, its registrations: a user's encoder)
    registered in this process, as the main process had it when it made the plan."""
    from sf_engine.envs import register_env

    for name, make_env in plan.registered_envs.items():
        register_env(name, make_env)
    for register, name, factory in plan.registrations:
        register(name, factory)


def run_role(role: str, index: int, generation: int, plan, queues) -> None:
    """Process target of every role: set-up, then `step` until the run stops or the main process is
    gone, then `finish`. An exception goes to the main process as a Fault with its traceback (logged
    once there, with the env id) and the process exits with 1; an EnvError (an env that does not fit the
    plan) stops the run as RunStopped does, with its one line."""
    _init_child(role, index, plan.paths.log_path)
    register_user_code(plan)
    set_torch_threads(role, plan.cfg)
    make_reproducible(role, plan.cfg)
    pin_to_cores(role, plan.cfg, index)
    buffers = SharedBuffers.attach(plan.paths.shm_path, plan.layout)
    ctx = RoleContext(plan, role, index, buffers, queues, generation)
    ctx.beat()
    watch, instance, timeout = ParentWatch(queues.lifeline), None, ROLES[role].step_timeout_sec
    try:
        instance = role_class(role)(ctx)
        logging.info("ready: %s", instance.describe())
        while not ctx.stopping and watch.parent_alive():
            instance.step(timeout)
        instance.finish()
    except RunStopped as exc:  # the role stops the run on purpose (supervisor): its line, no traceback
        ctx.send(messages.Fault(role, index, str(exc)))
        sys.exit(RUN_STOPPED_EXIT)
    except EnvError as exc:  # an env that does not fit the plan stops the run too: a restart would fail the same way
        ctx.send(messages.Fault(role, index, f"{role.replace('_', ' ')} {index}: {exc}"))
        sys.exit(RUN_STOPPED_EXIT)
    except Exception:
        ctx.send(messages.Fault(role, index, traceback.format_exc()))
        sys.exit(1)
    finally:
        if instance is not None:
            try:
                instance.close()
            except Exception:  # an env that failed may fail to close too; the process ends anyway
                pass
        if queues.device_obs is not None:  # dropped here: on CUDA the main process frees it once every process has
            queues.device_obs = instance = None
            gc.collect()


class InProcessRoles:
    """The roles `places` [(role, index)] of `plan`, built in this process over `buffers` and `queues`
    (wiring.make_queues without a multiprocessing context) and stepped in turn, in their serial order
    (ROLES: a request made in a round is served in it)."""

    def __init__(self, plan: RunPlan, buffers: SharedBuffers, queues: Queues, places: list):
        self.roles: dict = {}
        register_user_code(plan)  # a sampler node's process has only the plan
        try:
            for role, index in places:
                self.roles[(role, index)] = role_class(role)(RoleContext(plan, role, index, buffers, queues))
        except BaseException:  # the caller gets nothing to close: close what was built, raise what failed
            with contextlib.suppress(Exception):
                self.close()
            raise
        self.order = sorted(self.roles, key=lambda key: (ROLES[key[0]].serial_order, key[1]))

    def __getitem__(self, key) -> Role:
        """roles[("rollout_worker", 3)], or roles["learner"] for index 0."""
        return self.roles[key if isinstance(key, tuple) else (key, 0)]

    def step(self) -> None:
        """One unit of work of every role, none of them waiting."""
        for key in self.order:
            self.roles[key].step(0)

    def finish(self) -> None:
        for instance in self.roles.values():
            instance.finish()

    def close(self) -> None:
        """Every role closed, even when one fails to (an env that failed may fail to close too); the first
        failure is raised after."""
        failure = None
        for instance in self.roles.values():
            try:
                instance.close()
            except Exception as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
