"""--deterministic: the episodes of a run taken in the order they ended, not in the order their messages arrive.

Runs in the main process (RunStats). Rollout workers are processes: which of two workers' messages comes first,
and how a worker's episodes are cut into messages, follow the clock. Each episode carries its key (the step of
its split it ended at, the worker, the env) and each message the step before which its worker has reported every
episode (`through`); an episode is handed on once every worker is past its step, in the order of the keys, so
that the last-100 figures (return and length means) are the same in every run of the same seed.
"""

from __future__ import annotations

import heapq


class EpisodeOrder:
    def __init__(self, num_workers: int):
        self.through = [0] * num_workers  # per worker: every episode of it that ended before this step is here
        self.pending: list = []  # heap of (key, return, length, policy or None, seat or None)

    def add(self, message) -> list:
        """The episodes of an Episodes `message` booked; returns those now due, in order: [(return, length,
        policy or None, seat or None)]."""
        n = len(message.order)
        policies = message.policies if len(message.policies) == n else [None] * n
        seats = message.seats if len(message.seats) == n else [None] * n
        for entry in zip(map(tuple, message.order), message.returns, message.lengths, policies, seats):
            heapq.heappush(self.pending, entry)
        self.through[message.worker] = max(self.through[message.worker], message.through)
        return self._due(min(self.through))

    def flush(self) -> list:
        """Every episode still held (the run has stopped: no message is to come)."""
        return self._due(float("inf"))

    def _due(self, step) -> list:
        due = []
        while self.pending and self.pending[0][0][0] < step:
            due.append(heapq.heappop(self.pending)[1:])
        return due
