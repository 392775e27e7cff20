"""Every queue of a run and the process plumbing. All senders and receivers are wired here.

Queues carry small messages only (indices, versions, stats dicts), never trajectory data:
  policy_requests   rollout worker -> policy worker   (worker_idx, split_idx, slot, row)
  actions_ready[w]  policy worker  -> rollout worker w split_idx  (actions for that split are written)
  full_slots        rollout worker -> learner         slot index of a finished trajectory slot
  free_slots        learner/runner -> rollout worker  slot index that may be filled again
  stats             every role     -> runner          dict with a "kind" key
  params            learner        -> policy worker   the shared weight tensor, once at start-up
  eval_params       learner        -> evaluator       the same, when evaluation is on
"""
from __future__ import annotations

import logging
import os
import queue
import signal
from dataclasses import dataclass

from faster_fifo import Queue

Empty = queue.Empty

_QUEUE_BYTES = 1 << 20


@dataclass
class Queues:
    policy_requests: Queue
    actions_ready: list
    full_slots: Queue
    free_slots: Queue
    stats: Queue
    params: object
    eval_params: object


class LocalParamChannel:
    """Serial mode: the learner hands the shared weights to the policy worker in the same process."""

    def __init__(self):
        self._items = []

    def put(self, item) -> None:
        self._items.append(item)

    def get(self, timeout=None):
        if not self._items:
            raise Empty
        return self._items.pop(0)


def make_queues(num_workers: int, mp_context=None) -> Queues:
    """`mp_context` None means serial mode (no child processes)."""
    def param_channel():
        return LocalParamChannel() if mp_context is None else mp_context.Queue()

    return Queues(policy_requests=Queue(_QUEUE_BYTES),
                  actions_ready=[Queue(_QUEUE_BYTES) for _ in range(num_workers)],
                  full_slots=Queue(_QUEUE_BYTES), free_slots=Queue(_QUEUE_BYTES),
                  stats=Queue(4 * _QUEUE_BYTES), params=param_channel(), eval_params=param_channel())


def get_many(q: Queue, timeout_sec: float, max_messages: int = 10_000) -> list:
    """Messages waiting in `q`; blocks up to `timeout_sec` for the first (0 = never blocks). [] if none."""
    try:
        if timeout_sec > 0:
            return q.get_many(block=True, timeout=timeout_sec, max_messages_to_get=max_messages)
        return q.get_many(block=False, max_messages_to_get=max_messages)
    except Empty:
        return []


class ParentWatch:
    """Lets a child notice that the runner is gone (its parent changes when the run dies), so that
    no orphan keeps stepping envs."""

    def __init__(self):
        self._ppid = os.getppid()

    def parent_alive(self) -> bool:
        return os.getppid() == self._ppid


def init_child(role: str, index: int, log_path: str) -> None:
    """Common start of every child process: the runner alone handles Ctrl-C, logs go to the run's file."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(filename=log_path, level=logging.INFO,
                        format=f"%(asctime)s {role}[{index}] %(levelname)s %(message)s")


def stat(queues: Queues, kind: str, **fields) -> None:
    """Send a stats message to the runner; dropped (never blocks) if the runner is far behind."""
    try:
        queues.stats.put({"kind": kind, **fields}, block=False)
    except queue.Full:
        pass
