"""The choice of the pool's opponents: --opponent_sampling weights each snapshot of the pool by the learning
policies' win rate against it, measured so far (prioritized fictitious self-play, Vinyals et al. 2019).

With x the learning policies' win rate against a snapshot (a draw counting half):
  uniform    every snapshot alike (the default);
  pfsp       1 - x: the snapshots they still lose to, most;
  pfsp_hard  (1 - x)^2: more sharply so (AlphaStar's main agents against the league);
  pfsp_var   x (1 - x): those they beat about half the time (the ones at their level).
A pool of weights that are all zero (every snapshot always beaten, under pfsp) is drawn uniformly.
"""

from __future__ import annotations

import numpy as np

from sf_engine.selfplay.ratings import DRAW, WIN

WEIGHTINGS = {
    "uniform": lambda x: np.ones_like(x),
    "pfsp": lambda x: 1.0 - x,
    "pfsp_hard": lambda x: (1.0 - x) ** 2,
    "pfsp_var": lambda x: x * (1.0 - x),
}
WINDOW_GAMES = 200  # a win rate follows about the last this many games against a snapshot
PRIOR_GAMES = 4  # the games a new snapshot's 0.5 counts for


def sampling_weights(win_rates: np.ndarray, how: str) -> np.ndarray:
    """The chance of each snapshot to be drawn (summing to 1) for the win rates against them."""
    weights = np.clip(WEIGHTINGS[how](np.asarray(win_rates, np.float64)), 0.0, None)
    total = weights.sum()
    return weights / total if total > 0 else np.full(len(weights), 1.0 / max(len(weights), 1))


class WinRates:
    """The win rate of each of `rows` players (the learning policies, together or each) against each of `players`
    players, over about their last WINDOW_GAMES games against it: an average that its k-th game moves by
    1/min(k, WINDOW_GAMES). It starts at 0.5 (a snapshot just taken is as strong as them) as if from PRIOR_GAMES
    games, so that one lucky game cannot set it to 0 or 1."""

    def __init__(self, rows: int, players: int):
        self.rate = np.full((rows, players), 0.5)
        self.games = np.zeros((rows, players), np.int64)

    def add(self, row: int, player: int, results: np.ndarray) -> None:
        """New games of `row` against `player`: `results` (WIN, DRAW, LOSS) counts, from row's side."""
        n = int(results.sum())
        if n == 0:
            return
        score = (results[WIN] + 0.5 * results[DRAW]) / n
        keep = _kept(int(self.games[row, player]) + PRIOR_GAMES, n)
        self.rate[row, player] = keep * self.rate[row, player] + (1.0 - keep) * score
        self.games[row, player] += n

    def reset(self, player: int) -> None:
        """A new player in this place (a snapshot just taken): unknown, as strong as the learning policies."""
        self.rate[:, player], self.games[:, player] = 0.5, 0

    def reset_row(self, row: int) -> None:
        """The player of `row` started over (a league exploiter reset): its win rates are unknown again."""
        self.rate[row], self.games[row] = 0.5, 0

    def state(self) -> dict:
        return {"rate": self.rate.tolist(), "games": self.games.tolist()}

    def load(self, state: dict) -> None:
        if np.shape(state.get("rate", ())) == self.rate.shape:
            self.rate, self.games = np.array(state["rate"], np.float64), np.array(state["games"], np.int64)


def _kept(before: int, n: int) -> float:
    """The share of the average that stays after n games of one score, `before` games in: the product over
    k = before + 1 .. before + n of 1 - 1/min(k, WINDOW_GAMES) (a telescoping product below the window)."""
    end = before + n
    keep = before / min(end, WINDOW_GAMES) if before < WINDOW_GAMES else 1.0
    return keep * (1.0 - 1.0 / WINDOW_GAMES) ** max(0, end - max(before, WINDOW_GAMES))
