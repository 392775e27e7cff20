"""Every queue of a run with its sender and receiver, and the roles that run in processes: one place to
read (and grep) who talks to whom. Queues carry small messages only, never trajectory data.

  queue              sender                  receiver                 carries
  policy_requests[k] rollout workers w       policy worker k          InferenceRequest (worker, token, slot, row)
                     (w % policy workers
                     == k)
  actions_ready[w]   policy worker           rollout worker w         tokens: actions written (a ReplyPipe)
  full_slots         rollout workers,        learner                  index of a filled trajectory slot
                     receiver, device
                     samplers
  free_slots         SlotPool: learner,      rollout workers,         index of a slot that may be filled
                     supervisor, receiver    receiver
  stats              every role              main process (RunStats)  sf_engine.stats.messages dataclasses
  weights[reader, p] learner                 policy worker, evaluator, policy p's shared weight vector (SharedWeights)
                                             receiver, device samplers
  lifeline           held by the main process  every child           EOF once the main process is gone
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from faster_fifo import Queue

from sf_engine.config.algorithms import import_class
from sf_engine.runtime.ipc import LocalChannel, ReplyPipe
from sf_engine.runtime.shared_buffers import HEARTBEAT_ROLES, WEIGHT_READERS

_QUEUE_BYTES = 1 << 20


@dataclass(frozen=True)
class RoleSpec:
    """What the plumbing needs to know of a role. `cls`: "module:Class", imported in the process that
    runs it (rollout workers never import torch) and built from a RoleContext; `heartbeat`: its entry in
    the shared heartbeat array (rollout worker w: HEARTBEAT_WORKERS + w); `step_timeout_sec`: how long
    one `step` may wait in a process; `serial_order`: its turn in serial mode's round (a request made in
    a round is served in it); `torch_threads(cfg)`: torch threads of its process (None: no torch);
    `stop_phase`: the value of the shared stop flag that stops it (the learner stops last, once nothing
    samples any more, so that its last checkpoint counts every env step of the run)."""

    cls: str
    heartbeat: int | None
    step_timeout_sec: float
    serial_order: int
    torch_threads: object = None
    stop_phase: int = 1


LAST_STOP_PHASE = 2


HEARTBEAT_WORKERS = HEARTBEAT_ROLES  # heartbeat entries before the rollout workers' (shared_buffers.buffer_layout)
ROLES = {
    "learner": RoleSpec(
        "sf_engine.roles.learner:Learner", 0, 0.1, 2, lambda cfg: cfg.learner.learner_threads, LAST_STOP_PHASE
    ),
    "policy_worker": RoleSpec("sf_engine.roles.policy_worker:PolicyWorker", 1, 0.1, 1, lambda cfg: 1),
    "evaluator": RoleSpec("sf_engine.roles.evaluator:Evaluator", 2, 0.2, 3, lambda cfg: 1),
    "rollout_worker": RoleSpec("sf_engine.roles.rollout_worker:RolloutWorker", None, 0.1, 0),
    # device mode: one per device env batch, in the rollout workers' place (their heartbeat entries)
    "device_sampler": RoleSpec("sf_engine.roles.device_sampler:DeviceSampler", None, 0.1, 0, lambda cfg: 1),
    "receiver": RoleSpec("sf_engine.scaleout.receiver:Receiver", 3, 0.05, 1, lambda cfg: 1),
}


def role_class(role: str):
    return import_class(ROLES[role].cls)


def heartbeat_index(role: str, index: int = 0, num_learners: int = 1) -> int:
    """Entry of `role` (rollout worker `index`) in the shared heartbeat array; learner rank r > 0 (--num_learners):
    the r-th entry from its end; policy worker k > 0 (--num_policy_workers) the k-th before the learner ranks'."""
    if role == "learner" and index:
        return -index
    if role == "policy_worker" and index:
        return -(num_learners - 1) - index
    slot = ROLES[role].heartbeat
    return HEARTBEAT_WORKERS + index if slot is None else slot


def roles_of(cfg) -> list:
    """(role, index) of every process of a run, in start order (the learner publishes the weights first; its ranks
    with --num_learners); in device mode (a device env) a device sampler per --num_workers instead of the rollout and
    policy workers."""
    workers, learners = cfg.sampler.num_workers, [("learner", r) for r in range(cfg.parallel.num_learners)]
    if cfg.env.env_backend == "device":
        roles = learners + [("device_sampler", w) for w in range(workers)]
    else:
        roles = learners + [("policy_worker", k) for k in range(cfg.parallel.num_policy_workers if workers else 0)]
        roles += [("rollout_worker", w) for w in range(workers)]
    roles += [("receiver", 0)] if cfg.remote.num_remote_samplers else []
    return roles + ([("evaluator", 0)] if cfg.run.eval_every_sec > 0 else [])


def weight_readers(cfg) -> tuple:
    """The roles of a run that read the shared weights, a role once per process of it (the learner sends each
    process the shared vector on its role's channel)."""
    return tuple(role for role, _ in roles_of(cfg) if role in WEIGHT_READERS)


class InferenceRequest(NamedTuple):
    """A rollout worker's request on policy_requests: actions for the obs its split `token` (generation x
    splits + split) wrote at [slot, row]; the policy worker replies `token` on actions_ready[worker].
    On the queue it travels as the plain tuple of these fields, in this order (a NamedTuple pickles its
    class with every message)."""

    worker: int
    token: int
    slot: int
    row: int


@dataclass
class Queues:
    policy_requests: list  # [k]: policy worker k's (Queue)
    actions_ready: list
    full_slots: Queue
    free_slots: Queue
    stats: Queue
    weights: dict  # (reader role, policy) -> channel of that policy's shared weight vector
    lifeline: object = None  # read end of a pipe only the main process can write to
    device_obs: object = None  # device mode on a GPU: the observations in its memory (runtime.device_slots.DeviceObs)


def make_queues(
    num_workers: int, mp_context=None, lifeline=None, num_policies: int = 1, num_policy_workers: int = 1
) -> Queues:
    """`mp_context` None means serial mode (no child processes)."""

    def weight_channel():
        return LocalChannel() if mp_context is None else mp_context.Queue()

    return Queues(
        policy_requests=[new_policy_requests() for _ in range(num_policy_workers)],
        actions_ready=[ReplyPipe(mp_context) for _ in range(num_workers)],
        full_slots=Queue(_QUEUE_BYTES),
        free_slots=Queue(_QUEUE_BYTES),
        stats=Queue(4 * _QUEUE_BYTES),
        weights={(reader, policy): weight_channel() for reader in WEIGHT_READERS for policy in range(num_policies)},
        lifeline=lifeline,
    )


def run_queues(cfg, mp_context=None, lifeline=None) -> Queues:
    """The queues of a run of `cfg` (make_queues with its sizes)."""
    return make_queues(
        cfg.sampler.num_workers, mp_context, lifeline, cfg.policies.num_acting, cfg.parallel.num_policy_workers
    )


def policy_worker_of(worker: int, cfg) -> int:
    """The policy worker that serves rollout worker `worker`."""
    return worker % cfg.parallel.num_policy_workers


def new_policy_requests() -> Queue:
    """A restarted policy worker gets a new one (a killed waiter may have broken the old, see ipc)."""
    return Queue(_QUEUE_BYTES)
