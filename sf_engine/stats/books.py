"""Where a run's env steps went (Books), each policy's share of the training (PolicyBooks), and a replay learner's
reports of the steps it inserted, counted once across its deaths (ReplayReports). RunStats keeps them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Books:
    """Where the env steps went: sampled = trained + dropped for lag + not trainable (reset steps) +
    skipped for a non-finite observation, reward or action + recycled untrained (sampling only) + dropped
    with a failed worker + dropped with a lost sampler actor (--num_remote_samplers) + in flight at the
    stop (in local slots, or stepped by a sampler actor and not placed here yet)."""

    trained: int = 0
    dropped_lag: int = 0
    not_trainable: int = 0
    skipped_non_finite: int = 0
    recycled_untrained: int = 0
    inserted_replay: int = 0  # with a replay buffer: put into it (trained on there, any number of times)
    dropped_faults: int = 0
    dropped_lost_samplers: int = 0
    in_flight_at_stop: int | None = None

    def as_dict(self, sampled: int) -> dict:
        """`unaccounted` is 0 when none was lost (known once the steps in flight were counted)."""
        books = {"sampled": sampled, **vars(self)}
        if self.in_flight_at_stop is not None:
            books["unaccounted"] = sampled - sum(v for k, v in books.items() if k != "sampled")
        return books


@dataclass
class PolicyBooks:
    """One policy's lag over its training batches and the samples it trained (--num_policies > 1)."""

    lag_sum: float = 0.0
    lag_count: int = 0
    lag_max: float = 0.0
    trained: int = 0
    train_sec: float = 0.0  # the learner's time on this policy's samples
    forward_sec: float = 0.0  # the policy worker's time on this policy's forwards (batches of several policies)


class ReplayReports:
    """A replay learner reports the env steps it inserted since its last report (kept in shared memory,
    SharedBuffers.replay_books; every learner rank's, by rank 0) under a report number, then marks them reported
    and counts the number up in one write. A learner killed between the two leaves them there, and its successor
    sends them again, with what was inserted since, under the same number: only the difference is new."""

    def __init__(self):
        self.number, self.counted = 0, (0, 0, 0)

    def not_counted(self, m) -> tuple:
        """(inserted, not trainable, skipped non-finite) of the Training message `m` not counted before."""
        books = (m.inserted, m.not_trainable, m.skipped_non_finite)
        again = m.report_number == self.number
        new = tuple(b - c for b, c in zip(books, self.counted)) if again else books
        self.number, self.counted = m.report_number, books
        return new
