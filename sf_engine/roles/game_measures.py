"""What the learner measures of a two-player run of several acting policies: the games the rollout workers count
(SharedBuffers.game_results), rated (ratings.py), the learning policies' win rate against each pool snapshot, and
from those the chance of each snapshot to be drawn as an opponent (sampling.py, --opponent_sampling), which the
workers read from SharedBuffers.opponent_weights. Kept in the learner's checkpoints and training state."""

from __future__ import annotations

import logging
import time

import numpy as np

from sf_engine.selfplay.ratings import Ratings, RatingsUnavailable
from sf_engine.selfplay.sampling import WinRates, sampling_weights
from sf_engine.stats.messages import PlayerRating
from sf_engine.stats.messages import Ratings as RatingsMessage

MEASURE_EVERY_SEC = 1.0


class SelfPlayMeasures:
    """`results`: the workers' game counts [W, P, P, 3]; `weights`: the opponent chances [P] the workers read;
    `trained`: the trained policies (ids 0..trained-1; the pool's slots follow); `how`: --opponent_sampling."""

    def __init__(self, results: np.ndarray, weights: np.ndarray, trained: int, how: str, seed: int):
        self.results, self.weights, self.trained, self.how = results, weights, trained, how
        players = results.shape[1]
        try:
            self.ratings = Ratings(players)
        except RatingsUnavailable as exc:
            logging.warning("%s; the run goes on without them", exc)
            self.ratings = None
        self.win_rates = WinRates(players)
        self.present = np.zeros(players, bool)  # the pool's slots that hold a snapshot
        self.counted = results.sum(0)  # the games already taken in
        self.rng = np.random.default_rng([seed, 11])
        self.games = 0
        self.last = 0.0
        self._weigh()

    def measure_when_due(self, versions: list) -> RatingsMessage | None:
        """Takes in the games counted since the last call (at most every MEASURE_EVERY_SEC): rates them, moves the
        win rates and the opponent chances; returns the figures to report (None when it was not due). `versions`:
        each player's version (a slot with none yet: 0)."""
        if time.monotonic() - self.last < MEASURE_EVERY_SEC:
            return None
        self.last = time.monotonic()
        self.present[self.trained :] = np.asarray(versions[self.trained :]) > 0
        now = self.results.sum(0)
        new, self.counted = now - self.counted, now
        if self.ratings is not None:
            self.games += self.ratings.rate_counts(new, self.rng)
        for slot in range(self.trained, len(self.win_rates.rate)):
            self.win_rates.add(slot, new[: self.trained, slot].sum(0))
        self._weigh()
        return self.figures(versions)

    def snapshot_taken(self, slot: int) -> None:
        """Policy 0's weights went into pool slot `slot`: a new player, so far as strong as policy 0."""
        if self.ratings is not None:
            self.ratings.copy(0, slot)
        self.win_rates.reset(slot)
        self.present[slot] = True
        self._weigh()

    def _weigh(self) -> None:
        """Each snapshot's chance to be drawn (0 for a slot with none yet)."""
        slots = np.flatnonzero(self.present)
        chances = np.zeros(len(self.weights))
        chances[slots] = sampling_weights(self.win_rates.rate[slots], self.how)
        self.weights[self.trained :] = chances[self.trained :]

    def figures(self, versions: list) -> RatingsMessage:
        players = []
        for player, version in enumerate(versions):
            snapshot = player >= self.trained
            if snapshot and version == 0:
                continue  # a slot with no snapshot yet
            rating = self.ratings[player] if self.ratings is not None else None
            players.append(
                PlayerRating(
                    f"pool_{player - self.trained}" if snapshot else f"policy_{player}",
                    player,
                    version,
                    *((rating.mu, rating.sigma, rating.ordinal, rating.games) if rating else (None, None, None, 0)),
                    float(self.win_rates.rate[player]) if snapshot else None,
                    float(self.weights[player]) if snapshot else None,
                )
            )
        return RatingsMessage(players, self.games)

    def state(self) -> dict:
        """Numbers only (a checkpoint's part)."""
        return {
            "ratings": self.ratings.state() if self.ratings is not None else {},
            "win_rates": self.win_rates.state(),
            "games": self.games,
        }

    def load(self, state: dict, versions: list) -> None:
        """A checkpoint's measures; `versions`: each player's, as the pool was loaded (a slot with none: 0)."""
        self.present[self.trained :] = np.asarray(versions[self.trained :]) > 0
        if self.ratings is not None:
            self.ratings.load(state.get("ratings", {}))
        self.win_rates.load(state.get("win_rates", {}))
        self.games = int(state.get("games", 0))
        self._weigh()
