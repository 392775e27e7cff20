"""Ratings of the players of two-player games: openskill's Plackett-Luce model (Weng and Lin, 2011), a Bayesian
rating with an uncertainty per player, updated game by game.

Why openskill rather than Elo or TrueSkill: a snapshot that joins the pool, or a policy that starts, is a player
of unknown strength, and its uncertainty (sigma) lets its first games move it fast while the rating of a player
seen over thousands of games stays put (Elo moves every player by the same K); its dynamics factor (tau) keeps
the uncertainty of a player from vanishing, so the rating of a policy that keeps learning follows it. Its models
are the open alternative to TrueSkill of Weng and Lin's paper; the package is MIT-licensed, maintained, has no
dependencies, and rates a game in about 12 us here.

A game's result is given from the first player's side as an outcome index: WIN, DRAW or LOSS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

WIN, DRAW, LOSS = 0, 1, 2
_RANKS = {WIN: [0, 1], DRAW: [0, 0], LOSS: [1, 0]}  # openskill's ranks: lower is better, equal is a draw


def outcomes(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The first player's outcome (WIN, DRAW, LOSS) of games in which the players' returns were `first` and
    `second` (LOSS - outcome: the second player's)."""
    return (np.sign(np.asarray(second) - np.asarray(first)) + 1).astype(np.int64)


class RatingsUnavailable(ImportError):
    """openskill is not installed: one line on how to install it."""


def _model():
    try:
        from openskill.models import PlackettLuce
    except ImportError:
        raise RatingsUnavailable(
            "ratings need the openskill package: pip install 'sf_engine[pettingzoo]' (or pip install openskill)"
        ) from None
    return PlackettLuce()


@dataclass(frozen=True)
class Rating:
    """One player's rating: mu (25 for a new player) and its uncertainty sigma; `ordinal` = mu - 3 sigma, the
    conservative figure to rank by; `games` rated."""

    mu: float
    sigma: float
    games: int

    @property
    def ordinal(self) -> float:
        return self.mu - 3.0 * self.sigma


class Ratings:
    """The ratings of `players` players (a run's acting policies: the trained ones, then the pool's slots)."""

    def __init__(self, players: int):
        self.model = _model()
        self.players = [self.model.rating() for _ in range(players)]
        self.games = [0] * players

    def rate(self, first: int, second: int, outcome: int) -> None:
        """One game of `first` against `second`, `outcome` from first's side."""
        (a,), (b,) = self.model.rate([[self.players[first]], [self.players[second]]], ranks=_RANKS[outcome])
        self.players[first], self.players[second] = a, b
        self.games[first] += 1
        self.games[second] += 1

    def rate_counts(self, results: np.ndarray, rng: np.random.Generator) -> int:
        """The games of `results` [P, P, 3] (WIN, DRAW, LOSS counts of the row player against the column player,
        every game counted from both sides: at [i, j] and at [j, i]), each rated once, in a random order so that
        no pair's games all come before another's. Returns the games rated."""
        first, second = np.nonzero(np.triu(results.sum(-1), 1))
        games = [
            (i, j, outcome)
            for i, j in zip(first.tolist(), second.tolist())
            for outcome in (WIN, DRAW, LOSS)
            for _ in range(int(round(results[i, j, outcome])))
        ]
        for k in rng.permutation(len(games)):
            self.rate(*games[k])
        return len(games)

    def copy(self, source: int, target: int) -> None:
        """`target` becomes a copy of `source` (a snapshot of a policy joins the pool: the same player, so far)."""
        rating = self.players[source]
        self.players[target] = self.model.rating(mu=rating.mu, sigma=rating.sigma)
        self.games[target] = 0

    def restart(self, player: int) -> None:
        """`player` starts over (a league exploiter took its first weights again): a new player."""
        self.players[player] = self.model.rating()
        self.games[player] = 0

    def __getitem__(self, player: int) -> Rating:
        rating = self.players[player]
        return Rating(float(rating.mu), float(rating.sigma), self.games[player])

    def __len__(self) -> int:
        return len(self.players)

    def state(self) -> dict:
        """Numbers only (a checkpoint's part)."""
        return {
            "mu": [float(p.mu) for p in self.players],
            "sigma": [float(p.sigma) for p in self.players],
            "games": list(self.games),
        }

    def load(self, state: dict) -> None:
        """A checkpoint's ratings; one of another number of players is left aside (the run's policies changed)."""
        if len(state.get("mu", ())) != len(self.players):
            return
        self.players = [self.model.rating(mu=float(m), sigma=float(s)) for m, s in zip(state["mu"], state["sigma"])]
        self.games = [int(g) for g in state["games"]]


def round_robin(players: int, games: int, play: Callable[[int, int, int], tuple]) -> tuple[Ratings, np.ndarray]:
    """`games` rounds in which every pair of `players` players meets once (neighbours first: 0-1, 1-2, ..., then
    0-2, ...), the seats swapped from round to round; `play(first, second, round)` plays one game and returns the two
    players' returns. Every game is rated as it ends. Returns the ratings and the results [P, P, 3] (WIN, DRAW, LOSS
    counts of the row player against the column player, every game counted from both sides)."""
    ratings, results = Ratings(players), np.zeros((players, players, 3), dtype=np.int64)
    pairs = [(a, a + gap) for gap in range(1, players) for a in range(players - gap)]
    for game in range(games):
        for a, b in pairs:
            first, second = (a, b) if game % 2 == 0 else (b, a)
            outcome = int(outcomes(*play(first, second, game)))
            ratings.rate(first, second, outcome)
            results[first, second, outcome] += 1
            results[second, first, LOSS - outcome] += 1
    return ratings, results
