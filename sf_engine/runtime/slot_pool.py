"""The trajectory slots' pool: the one place that takes free slots and puts slots back.

A slot circulates: a filler (a rollout worker, the receiver) takes a free one from the free_slots queue,
marked as its own in `slot_owner` while it writes (`slot_rows` counts the env-step rows written), then
hands its index over to the learner through full_slots; the learner (or whoever takes a slot back from a
dead filler) recycles it: its rows leave the books, its owner is cleared, and it goes back on the free
queue. Free slots are polled, never waited for on the shared queue: a process killed while waiting on
it would break it for everybody (see sf_engine.runtime.ipc).
"""

from __future__ import annotations

import time

import numpy as np

from sf_engine.runtime.ipc import get_many
from sf_engine.runtime.shared_buffers import NO_OWNER

POLL_SEC = 0.0005  # how often a filler with nothing else to do looks for a free slot


class SlotPool:
    """The slots of a run's `buffers` (SharedBuffers) circulating through `queues` (wiring.Queues)."""

    def __init__(self, buffers, queues):
        self.buffers, self.queues = buffers, queues

    def fill(self) -> None:
        """At the start of a run: every slot free."""
        self.queues.free_slots.put_many(list(range(len(self.buffers.slot_owner))))

    def take_free(self, max_slots: int, owner: int, timeout_sec: float = 0.0) -> list:
        """Up to `max_slots` free slot indices, marked as written by `owner` (a rollout worker's index, or
        WRITING); when none is free, polls for one for at most `timeout_sec`."""
        free = get_many(self.queues.free_slots, 0, max_messages=max_slots)
        if not free and timeout_sec > 0:
            deadline = time.monotonic() + timeout_sec
            while not free and time.monotonic() < deadline:
                time.sleep(POLL_SEC)
                free = get_many(self.queues.free_slots, 0, max_messages=max_slots)
        if free:
            self.buffers.slot_owner[free] = owner
        return free

    def hand_over(self, slot: int) -> None:
        """A slot its owner has filled: owned by no one again, and its index to the learner."""
        self.buffers.slot_owner[slot] = NO_OWNER
        self.queues.full_slots.put(slot)

    def recycle(self, slots) -> int:
        """Put `slots` (indices) back on the free queue, owned by no one; returns the env steps they held
        (trained, or dropped by the caller: they leave the books of steps not trained yet)."""
        slots = list(slots)
        if not slots:
            return 0
        steps = self.buffers.take_rows(slots)
        self.buffers.slot_owner[slots] = NO_OWNER
        self.queues.free_slots.put_many(slots)
        return steps

    def owned_by(self, owners) -> list:
        """The slots being written by any of `owners` (rollout worker indices, or WRITING)."""
        return np.flatnonzero(np.isin(self.buffers.slot_owner, owners)).tolist()
