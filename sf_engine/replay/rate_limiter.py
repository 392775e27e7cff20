"""The replay ratio's rate limiter (the idea of Reverb's SampleToInsertRatio): samples trained per env step
inserted held at --replay_ratio once --learning_starts env steps are in. Runs in the learner process, over the
replay buffer's shared counters (so a restarted learner goes on from the same books).

The learner trains while the allowance, replay_ratio x (env steps inserted - learning_starts) - samples trained,
holds a whole batch, and takes the next full trajectory slot only when it does not: when learning is the slower
side, full slots wait for it and the rollout workers wait for free slots (sampling waits); when sampling is the
slower side, the learner waits for data. Either way the ratio stays within one batch (or one slot's worth of
samples) of the target.
"""

from __future__ import annotations

from sf_engine.replay.layout import REPLAY_INSERTED, REPLAY_SAMPLED


class RateLimiter:
    def __init__(self, counters, replay_ratio: float, learning_starts: int, batch_size: int):
        """`counters`: the replay buffer's counters (sf_engine.replay.layout), read and written here."""
        self.counters, self.ratio, self.learning_starts, self.batch_size = (
            counters,
            replay_ratio,
            learning_starts,
            batch_size,
        )

    @property
    def inserted(self) -> int:
        return int(self.counters[REPLAY_INSERTED])

    @property
    def sampled(self) -> int:
        return int(self.counters[REPLAY_SAMPLED])

    @property
    def started(self) -> bool:
        """Whether --learning_starts env steps are in."""
        return self.inserted >= self.learning_starts

    def allowance(self) -> float:
        """Samples the ratio allows to train now (negative: trained ahead)."""
        return self.ratio * (self.inserted - self.learning_starts) - self.sampled

    def batches(self) -> int:
        """The whole batches the ratio allows to train now."""
        return max(0, int(self.allowance() // self.batch_size)) if self.started else 0

    def can_train(self) -> bool:
        """A whole batch may be trained now."""
        return self.batches() > 0

    def inserted_steps(self, env_steps: int) -> None:
        self.counters[REPLAY_INSERTED] += env_steps

    def trained(self, samples: int) -> None:
        self.counters[REPLAY_SAMPLED] += samples

    def rebase(self) -> None:
        """A refilled buffer (--save_replay) under this run's --replay_ratio and --learning_starts: its books as if
        it had been trained at this ratio, so that a changed ratio neither trains a backlog with sampling stopped
        nor inserts a long stretch with no training."""
        self.counters[REPLAY_SAMPLED] = max(0, round(self.ratio * (self.inserted - self.learning_starts)))

    def replay_ratio(self) -> float | None:
        """Samples trained per env step inserted since learning started (None before)."""
        steps = self.inserted - self.learning_starts
        return self.sampled / steps if steps > 0 else None
