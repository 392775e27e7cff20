"""Every queue of a run and the process plumbing. All senders and receivers are wired here.

Queues carry small messages only (indices, versions, stats dicts), never trajectory data:
  policy_requests   rollout worker -> policy worker   (worker_idx, token, slot, row)
  actions_ready[w]  policy worker  -> rollout worker w  tokens (actions for that split are written);
                                                      a pipe, see ReplyPipe
  full_slots        rollout worker -> learner         slot index of a finished trajectory slot
  free_slots        learner/runner -> rollout worker  slot index that may be filled again
  stats             every role     -> runner          dict with a "kind" key
  params            learner        -> policy worker   the shared weight tensor, at start-up and again for
                                                      a restarted policy worker (runner sets params_wanted)
  eval_params       learner        -> evaluator       the same, when evaluation is on

Surviving a killed process: faster-fifo queues wait on process-shared condition variables, and a
process killed while waiting on one leaves it unusable (the next signal on it can block forever).
So a process that may be killed and restarted never waits on a queue others keep using: rollout
workers wait for actions on their own pipe (kernel objects, robust to a dead reader) and poll for
free slots; the runner polls its stats queue; a restarted policy worker gets a new policy_requests
queue (the rollout workers are restarted with it).
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import select
import signal
import time
import traceback
from dataclasses import dataclass

import numpy as np
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
    lifeline: object = None  # read end of a pipe only the runner can write to: EOF once it is gone


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


class ReplyPipe:
    """Policy worker -> one rollout worker: int64 tokens through an OS pipe. A write of at most
    PIPE_BUF bytes is atomic, so a read always returns whole tokens; a dead reader leaves nothing
    broken behind (its successor reads the same pipe and skips stale tokens)."""

    _MAX_READ = 4096  # a multiple of 8 bytes
    _MAX_WRITE = select.PIPE_BUF // 8 * 8  # whole tokens, atomic

    def __init__(self, mp_context=None):
        self.reader, self.writer = (mp_context or multiprocessing).Pipe(duplex=False)
        self._poll = None

    def send(self, tokens: list) -> None:
        data = np.asarray(tokens, np.int64).tobytes()
        for start in range(0, len(data), self._MAX_WRITE):
            os.write(self.writer.fileno(), data[start:start + self._MAX_WRITE])

    def receive(self, timeout_sec: float) -> list:
        """Tokens waiting (blocks up to `timeout_sec` for the first; 0 = never blocks)."""
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self.reader.fileno(), select.POLLIN)
        if not self._poll.poll(int(timeout_sec * 1000) if timeout_sec > 0 else 0):
            return []
        return np.frombuffer(os.read(self.reader.fileno(), self._MAX_READ), np.int64).tolist()

    def __getstate__(self):
        return {"reader": self.reader, "writer": self.writer}

    def __setstate__(self, state):
        self.reader, self.writer, self._poll = state["reader"], state["writer"], None


def make_lifeline(mp_context):
    """(read end for the children, write end the runner keeps and never writes to)."""
    return mp_context.Pipe(duplex=False)


def make_queues(num_workers: int, mp_context=None, lifeline=None) -> Queues:
    """`mp_context` None means serial mode (no child processes)."""
    def param_channel():
        return LocalParamChannel() if mp_context is None else mp_context.Queue()

    return Queues(policy_requests=new_policy_requests(),
                  actions_ready=[ReplyPipe(mp_context) for _ in range(num_workers)],
                  full_slots=Queue(_QUEUE_BYTES), free_slots=Queue(_QUEUE_BYTES),
                  stats=Queue(4 * _QUEUE_BYTES), params=param_channel(), eval_params=param_channel(),
                  lifeline=lifeline)


def new_policy_requests() -> Queue:
    return Queue(_QUEUE_BYTES)


def drain(q: Queue, max_rounds: int = 1000) -> list:
    """Every message waiting in `q` without blocking. One get_many may return only part of them (its
    read buffer grows as needed), so this reads until the queue is empty."""
    messages = []
    for _ in range(max_rounds):
        batch = get_many(q, 0)
        if not batch:
            break
        messages += batch
    return messages


def get_many(q: Queue, timeout_sec: float, max_messages: int = 10_000) -> list:
    """Messages waiting in `q`; blocks up to `timeout_sec` for the first (0 = never blocks). [] if none."""
    try:
        if timeout_sec > 0:
            return q.get_many(block=True, timeout=timeout_sec, max_messages_to_get=max_messages)
        return q.get_many(block=False, max_messages_to_get=max_messages)
    except Empty:
        return []


class ParentWatch:
    """Lets a child notice that the runner is gone, so that no orphan keeps stepping envs. Children
    are forked by the forkserver, which outlives a killed runner while they live, so the parent pid
    says nothing: the runner holds the only write end of the lifeline pipe, and its read end turns
    readable (EOF) when the runner dies. Checked at most every CHECK_EVERY_SEC."""

    CHECK_EVERY_SEC = 0.1

    def __init__(self, lifeline):
        self._poll = select.poll()
        self._poll.register(lifeline.fileno(), select.POLLIN | select.POLLHUP)
        self._lifeline = lifeline  # keeps the fd open
        self._next_check = 0.0

    def parent_alive(self) -> bool:
        now = time.monotonic()
        if now < self._next_check:
            return True
        self._next_check = now + self.CHECK_EVERY_SEC
        return not self._poll.poll(0)


def init_child(role: str, index: int, log_path: str) -> None:
    """Common start of every child process: the runner alone handles Ctrl-C, logs go to the run's file."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    logging.basicConfig(filename=log_path, level=logging.INFO,
                        format=f"%(asctime)s {role}[{index}] %(levelname)s %(message)s")


def report_fault(queues: Queues, role: str, index: int) -> None:
    """From an `except` block of a role's process: its traceback goes to the runner, which logs it once
    (with the env id) and decides what to restart."""
    stat(queues, "fault", role=role, index=index, traceback=traceback.format_exc())


def stat(queues: Queues, kind: str, **fields) -> None:
    """Send a stats message to the runner; dropped (never blocks) if the runner is far behind."""
    try:
        queues.stats.put({"kind": kind, **fields}, block=False)
    except queue.Full:
        pass
