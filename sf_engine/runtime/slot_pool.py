"""The trajectory slots' pool: the one place that takes free slots and puts slots back.

A slot circulates: a filler (a rollout worker, the receiver) takes a free one from the free_slots queue,
marked as its own in `slot_owner` while it writes (`slot_rows` counts the env-step rows written), then
hands its index over to the learner through full_slots; the learner (or whoever takes a slot back from a
dead filler) recycles it: its rows leave the books, its owner is cleared, and it goes back on the free
queue. Free and full slots are polled, never waited for on the shared queues: a process killed while waiting
on one would break it for everybody (see sf_engine.runtime.ipc), and every process that takes slots may
be killed and restarted (the learner too).
"""

from __future__ import annotations

import time

import numpy as np

from sf_engine.runtime.ipc import get_many
from sf_engine.runtime.shared_buffers import LEARNING, NO_OWNER

POLL_SEC = 0.0005  # how often a filler (the learner) with nothing else to do looks for a free (full) slot


def _poll(queue, max_slots: int, timeout_sec: float) -> list:
    """Up to `max_slots` slot indices from `queue`, looked for every POLL_SEC for at most `timeout_sec`."""
    slots = get_many(queue, 0, max_messages=max_slots)
    if not slots and timeout_sec > 0:
        deadline = time.monotonic() + timeout_sec
        while not slots and time.monotonic() < deadline:
            time.sleep(POLL_SEC)
            slots = get_many(queue, 0, max_messages=max_slots)
    return slots


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
        free = _poll(self.queues.free_slots, max_slots, timeout_sec)
        if free:
            self.buffers.slot_owner[free] = owner
        return free

    def take_full(self, max_slots: int, timeout_sec: float) -> list:
        """Up to `max_slots` filled slot indices for the learner, marked LEARNING (a dead learner's go back
        through `recycle`); when none is full, polls for one for at most `timeout_sec`."""
        full = _poll(self.queues.full_slots, max_slots, timeout_sec)
        if full:
            self.buffers.slot_owner[full] = LEARNING
        return full

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
        """The slots held by any of `owners` (rollout worker indices, WRITING or LEARNING)."""
        return np.flatnonzero(np.isin(self.buffers.slot_owner, owners)).tolist()


def deterministic_rounds(cfg, env_steps_base: int) -> int | None:
    """--deterministic in --mode sync with an env-step budget: the rounds of a run (a round: every split fills
    one slot, config.checks makes a training batch one round), each split stopping after its last, so that the run
    ends at the same env step every time; None otherwise (no split stops by itself)."""
    budget = cfg.run.train_for_env_steps
    if not (cfg.run.deterministic and cfg.run.mode == "sync") or budget is None:
        return None
    return max(0, -(-(budget - env_steps_base) // round_env_steps(cfg)))


def round_env_steps(cfg) -> int:
    """Env steps of one round of every split (one slot each)."""
    return cfg.sampler.total_splits * cfg.samples_per_slot


def env_step_stop(cfg, env_steps_base: int) -> int | None:
    """The env steps the run stops at: --train_for_env_steps, or under --deterministic in --mode sync the end of
    the round that reaches it (deterministic_rounds); None without an env-step budget."""
    rounds = deterministic_rounds(cfg, env_steps_base)
    if rounds is None:
        return cfg.run.train_for_env_steps
    return env_steps_base + rounds * round_env_steps(cfg)
