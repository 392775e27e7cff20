"""What the learner measures of a two-player run of several acting policies: the games the rollout workers count
(SharedBuffers.game_results), rated (sf_engine.selfplay.ratings) and kept in a payoff table (payoff.json), the win
rates against the players, and from those who plays whom: with a plain pool, each snapshot's chance to be drawn
(--opponent_sampling; SharedBuffers.opponent_weights), with --league, each trained player's opponents
(sf_engine.selfplay.league; SharedBuffers.match_chances) and when it is frozen into the pool. Kept in the learner's
checkpoints and training state."""

from __future__ import annotations

import logging
import time

import numpy as np

from sf_engine.selfplay.league import EMPTY, ROLES, freeze_due, match_chances
from sf_engine.selfplay.payoff import Payoff
from sf_engine.selfplay.ratings import Ratings, RatingsUnavailable
from sf_engine.selfplay.sampling import WinRates, sampling_weights
from sf_engine.stats.messages import PlayerRating
from sf_engine.stats.messages import Ratings as RatingsMessage

MEASURE_EVERY_SEC = 1.0
PAYOFF_EVERY_SEC = 10.0


class SelfPlayMeasures:
    """`buffers`: the run's shared buffers (game_results [W, P, P, 3] in; opponent_weights, match_chances out);
    `trained`: the trained policies (ids 0..trained-1; the pool's slots follow); `pcfg`: the policies' config;
    `experiment_dir`: where payoff.json goes (None: nowhere)."""

    def __init__(self, buffers, trained: int, pcfg, seed: int, experiment_dir: str | None):
        self.results, self.weights, self.chances = buffers.game_results, buffers.opponent_weights, buffers.match_chances
        self.trained, self.how, self.league, self.experiment_dir = (
            trained,
            pcfg.opponent_sampling,
            pcfg.league,
            experiment_dir,
        )
        players = self.results.shape[1]
        try:
            self.ratings = Ratings(players)
        except RatingsUnavailable as exc:
            logging.warning("%s; the run goes on without them", exc)
            self.ratings = None
        self.win_rates = WinRates(trained if self.league else 1, players)  # a plain pool: the trained ones together
        self.sources = np.array(list(range(trained)) + [EMPTY] * (players - trained))  # the role each copies
        # each player's name in the payoff table: a trained policy's role (policy_<p> without a league; a league
        # exploiter that started over: main_exploiter#2, ...), a snapshot '<its source's name>@v<version>'
        self.names = (list(ROLES) if self.league else [f"policy_{p}" for p in range(trained)]) + [None] * (
            players - trained
        )
        self.generations = [1] * trained
        self.since = np.zeros((trained, 3))  # each trained player's games since it was last frozen (league)
        self.payoff = Payoff()
        self.counted = self.results.sum(0)  # the games already taken in
        self.rng = np.random.default_rng([seed, 11])
        self.games, self.last, self.last_payoff = 0, 0.0, time.monotonic()
        self._weigh()

    def measure_when_due(self, versions: list) -> RatingsMessage | None:
        """At most every MEASURE_EVERY_SEC: the games since the last look taken in, who plays whom weighed again;
        returns the figures to report (None when it was not due). `versions`: each player's version (a slot with
        none yet: 0)."""
        if time.monotonic() - self.last < MEASURE_EVERY_SEC:
            return None
        self.last = time.monotonic()
        self.take_in()
        self._weigh()
        if self.experiment_dir is not None and time.monotonic() - self.last_payoff >= PAYOFF_EVERY_SEC:
            self.write_payoff()
        return self.figures(versions)

    def take_in(self) -> None:
        """The games the workers counted since the last call: rated, in the payoff table, in the win rates (and the
        league's counts since each freeze). Called before a player changes (a snapshot replaces a slot's, an
        exploiter starts over), so that its games stay its own; games still being played then go to the new one."""
        now = self.results.sum(0)
        new, self.counted = now - self.counted, now
        if self.ratings is not None:
            self.games += self.ratings.rate_counts(new, self.rng)
        self.payoff.add(new, self.names)
        if self.league:
            for player in range(self.trained):
                others = np.arange(new.shape[1]) != player
                self.since[player] += new[player, others].sum(0)
                for opponent in np.flatnonzero(others):
                    self.win_rates.add(player, opponent, new[player, opponent])
        else:
            for slot in range(self.trained, new.shape[1]):
                self.win_rates.add(0, slot, new[: self.trained, slot].sum(0))

    def write_payoff(self) -> None:
        self.last_payoff = time.monotonic()
        try:
            self.payoff.write(self.experiment_dir)
        except OSError as exc:  # a full disk costs the table, never the run
            logging.warning("payoff.json not written: %s", exc.strerror or exc)

    def snapshot_taken(self, slot: int, source: int, version: int) -> None:
        """Trained policy `source`'s weights of `version` went into pool slot `slot` (its games so far taken in):
        a new player, so far as strong as it."""
        if self.ratings is not None:
            self.ratings.copy(source, slot)
        self.win_rates.reset(slot)
        self.sources[slot] = source
        self.names[slot] = f"{self.names[source]}@v{version}"
        self.since[source] = 0
        self._weigh()

    def freeze_due(self, player: int, versions_since: int, win_rate: float, max_versions: int) -> bool:
        return freeze_due(player, self.since[player], versions_since, win_rate, max_versions)

    def started_over(self, player: int) -> None:
        """A league exploiter took its first weights again (its games so far taken in): a new player, of unknown
        strength, under a name of its own in the payoff table."""
        self.generations[player] += 1
        self.names[player] = f"{ROLES[player]}#{self.generations[player]}"
        if self.ratings is not None:
            self.ratings.restart(player)
        self.win_rates.reset_row(player)
        self.win_rates.reset(player)
        self._weigh()

    def _weigh(self) -> None:
        """Who plays whom: the league's chances, or each snapshot's chance to be drawn (0 for an empty slot)."""
        if self.league:
            self.chances[:] = match_chances(self.win_rates.rate, self.sources)
            return
        slots = np.flatnonzero(self.sources != EMPTY)
        slots = slots[slots >= self.trained]
        chances = np.zeros(len(self.weights))
        chances[slots] = sampling_weights(self.win_rates.rate[0, slots], self.how)
        self.weights[self.trained :] = chances[self.trained :]

    def figures(self, versions: list) -> RatingsMessage:
        players, names = [], self.names
        for player, version in enumerate(versions):
            snapshot = player >= self.trained
            if snapshot and self.sources[player] == EMPTY:
                continue
            rating = self.ratings[player] if self.ratings is not None else None
            against = self.win_rates.rate[0, player] if snapshot and not self.league else None
            players.append(
                PlayerRating(
                    f"pool_{player - self.trained}" if snapshot else ROLES[player] if self.league else names[player],
                    player,
                    version,
                    snapshot,
                    *((rating.mu, rating.sigma, rating.ordinal, rating.games) if rating else (None, None, None, 0)),
                    None if against is None else float(against),
                    float(self.weights[player]) if snapshot and not self.league else None,
                    names[player],
                )
            )
        return RatingsMessage(players, self.games)

    def state(self) -> dict:
        """Numbers only (a checkpoint's part)."""
        return {
            "ratings": self.ratings.state() if self.ratings is not None else {},
            "win_rates": self.win_rates.state(),
            "games": self.games,
            "sources": self.sources.tolist(),
            "since": self.since.tolist(),
            "names": ["" if name is None else name for name in self.names],
            "generations": list(self.generations),
            "payoff": self.payoff.state(),
        }

    def load(self, state: dict) -> None:
        if self.ratings is not None:
            self.ratings.load(state.get("ratings", {}))
        self.win_rates.load(state.get("win_rates", {}))
        self.games = int(state.get("games", 0))
        if len(state.get("sources", ())) == len(self.sources):
            self.sources = np.array(state["sources"], np.int64)
            self.since = np.array(state["since"], np.float64).reshape(self.since.shape)
            self.names = [name or None for name in state["names"]]
            self.generations = [int(g) for g in state["generations"]]
        self.payoff.load(state.get("payoff", {}))
        self._weigh()

    def adopt_pool(self, versions: list) -> None:
        """A pool loaded from a checkpoint that has no measures of it: its snapshots are policy 0's."""
        for slot in range(self.trained, len(versions)):
            if versions[slot] > 0 and self.sources[slot] == EMPTY:
                self.sources[slot], self.names[slot] = 0, f"{self.names[0]}@v{versions[slot]}"
        self._weigh()
