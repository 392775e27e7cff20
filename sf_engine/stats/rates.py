"""Counters sampled over time and their rates: the one rate window of the run's figures (env steps/s,
learner samples/s, each sampler actor's env steps/s)."""

from __future__ import annotations

from collections import deque


class RateWindow:
    """(time, counts...) samples of the last `span_sec`; `rate` and `rates` per second over the last
    seconds, from the oldest sample within them to the newest."""

    def __init__(self, span_sec: float = 60.0):
        self.span_sec = span_sec
        self.samples: deque = deque()  # (time, (count, ...))

    def add(self, now: float, counts: tuple) -> None:
        self.samples.append((now, tuple(counts)))
        while now - self.samples[0][0] > self.span_sec:
            self.samples.popleft()

    def rates(self, window_sec: float) -> list:
        """Each count's rate per second over the last `window_sec` (0 with fewer than two samples)."""
        if not self.samples:
            return []
        now, newest = self.samples[-1]
        then, oldest = next((s for s in self.samples if now - s[0] <= window_sec), self.samples[-1])
        if now <= then:
            return [0.0] * len(newest)
        return [(new - old) / (now - then) for new, old in zip(newest, oldest)]

    def rate(self, window_sec: float, column: int = 0) -> float:
        rates = self.rates(window_sec)
        return rates[column] if rates else 0.0
