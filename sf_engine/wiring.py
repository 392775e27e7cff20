"""Every queue of a run with its sender and receiver, and the roles that run in processes: one place to
read (and grep) who talks to whom. Queues carry small messages only, never trajectory data.

  queue              sender                  receiver                 carries
  policy_requests    rollout workers         policy worker            (worker, token, slot, row)
  actions_ready[w]   policy worker           rollout worker w         tokens: actions written (a ReplyPipe)
  full_slots         rollout workers         learner                  index of a filled trajectory slot
  free_slots         learner, supervisor     rollout workers          index of a slot that may be filled
  stats              every role              main process (RunStats)  sf_engine.messages dataclasses
  weights[reader]    learner                 policy worker, evaluator the shared weight vector (SharedWeights)
  lifeline           held by the main process  every child           EOF once the main process is gone
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from faster_fifo import Queue

from sf_engine.ipc import LocalChannel, ReplyPipe
from sf_engine.shared_buffers import WEIGHT_READERS

_QUEUE_BYTES = 1 << 20

# role -> "module:Class" of the role (imported in the process that runs it: rollout workers never import
# torch); each role class is built from a RoleContext and stepped by sf_engine.process.run_role
ROLES = {"learner": "sf_engine.learner:Learner", "policy_worker": "sf_engine.policy_worker:PolicyWorker",
         "rollout_worker": "sf_engine.rollout_worker:RolloutWorker", "evaluator": "sf_engine.evaluator:Evaluator"}


def role_class(role: str):
    module, _, name = ROLES[role].partition(":")
    return getattr(importlib.import_module(module), name)


def roles_of(cfg) -> list:
    """(role, index) of every process of a run, in start order (the learner publishes the weights first)."""
    roles = [("learner", 0), ("policy_worker", 0)] + [("rollout_worker", w) for w in range(cfg.sampler.num_workers)]
    return roles + ([("evaluator", 0)] if cfg.run.eval_every_sec > 0 else [])


@dataclass
class Queues:
    policy_requests: Queue
    actions_ready: list
    full_slots: Queue
    free_slots: Queue
    stats: Queue
    weights: dict  # reader role -> channel of the shared weight vector
    lifeline: object = None  # read end of a pipe only the main process can write to


def make_queues(num_workers: int, mp_context=None, lifeline=None) -> Queues:
    """`mp_context` None means serial mode (no child processes)."""
    def weight_channel():
        return LocalChannel() if mp_context is None else mp_context.Queue()

    return Queues(policy_requests=new_policy_requests(),
                  actions_ready=[ReplyPipe(mp_context) for _ in range(num_workers)],
                  full_slots=Queue(_QUEUE_BYTES), free_slots=Queue(_QUEUE_BYTES), stats=Queue(4 * _QUEUE_BYTES),
                  weights={reader: weight_channel() for reader in WEIGHT_READERS}, lifeline=lifeline)


def new_policy_requests() -> Queue:
    """A restarted policy worker gets a new one (a killed waiter may have broken the old, see ipc)."""
    return Queue(_QUEUE_BYTES)
