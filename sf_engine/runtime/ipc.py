"""Process plumbing primitives: faster-fifo reads, the reply pipe, the local channel of serial mode and the
parent watch. Which queue connects which roles is in sf_engine.runtime.wiring.

Surviving a killed process: faster-fifo queues wait on process-shared condition variables, and a
process killed while waiting on one leaves it unusable (the next signal on it can block forever).
So a process that may be killed and restarted never waits on a queue others keep using: rollout
workers wait for actions on their own pipe (kernel objects, robust to a dead reader) and poll for
free slots; the learner polls for full slots; the runner polls its stats queue; a restarted policy
worker gets a new policy_requests queue (the rollout workers are restarted with it).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import select
import signal
import time

import numpy as np
from faster_fifo import Queue

Empty = queue.Empty


class LocalChannel:
    """Serial mode: a channel between roles in the same process (the shared weights' channels)."""

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
            os.write(self.writer.fileno(), data[start : start + self._MAX_WRITE])

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


def drain_into(q: Queue, consume) -> None:
    """consume(every message waiting in `q`), with SIGINT and SIGTERM held until both are done: a
    Ctrl-C between taking the messages off the queue and counting them would lose them (the main
    process's stats, whose books of env steps must balance)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        consume(drain(q))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


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
