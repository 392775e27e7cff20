"""The payoff table of a self-play run: every player that ever played (a trained policy by its name, a snapshot as
'<its source>@v<version>') against every other, the games each won, drew and lost. The learner keeps it and writes
it to the experiment as payoff.json; `python -m sf_engine.selfplay.payoff EXPERIMENT_DIR` draws it as payoff.png
(each player's win rate against each, with matplotlib: the `[perf]` extra).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from sf_engine.selfplay.ratings import DRAW, WIN

FILE = "payoff.json"


class Payoff:
    """The table, grown as new players appear."""

    def __init__(self):
        self.players: list = []
        self.results = np.zeros((0, 0, 3))

    def add(self, new: np.ndarray, names: list) -> None:
        """New games [P, P, 3] between the acting policies, named `names` (None: a slot with no snapshot)."""
        for i, j in zip(*np.nonzero(new.sum(-1))):
            if i != j and names[i] is not None and names[j] is not None:
                row, column = self._index(names[i]), self._index(names[j])  # (the table may grow)
                self.results[row, column] += new[i, j]

    def _index(self, name: str) -> int:
        if name not in self.players:
            self.players.append(name)
            grown = np.zeros((len(self.players), len(self.players), 3))
            grown[:-1, :-1] = self.results
            self.results = grown
        return self.players.index(name)

    def win_rates(self) -> np.ndarray:
        """[players, players]: the row player's win rate against the column player (a draw half; NaN: no games)."""
        games = self.results.sum(-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(games > 0, (self.results[..., WIN] + 0.5 * self.results[..., DRAW]) / games, np.nan)

    def state(self) -> dict:
        return {"players": list(self.players), "results": self.results.tolist()}

    def load(self, state: dict) -> None:
        players = list(state.get("players", []))
        results = np.array(state.get("results", []), np.float64).reshape(len(players), len(players), 3)
        self.players, self.results = players, results

    def write(self, experiment_dir: str) -> None:
        """payoff.json, whole or not at all."""
        path = os.path.join(experiment_dir, FILE)
        with open(path + ".tmp", "w") as f:
            json.dump(self.state(), f)
        os.replace(path + ".tmp", path)


def draw(experiment_dir: str) -> str:
    """payoff.png of the experiment's payoff.json; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    payoff = Payoff()
    with open(os.path.join(experiment_dir, FILE)) as f:
        payoff.load(json.load(f))
    rates = payoff.win_rates()
    size = max(4.0, 0.3 * len(payoff.players) + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    colours = matplotlib.colormaps["RdBu"].copy()
    colours.set_bad("lightgrey")  # no games between the two
    image = ax.imshow(np.ma.masked_invalid(rates), cmap=colours, vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(payoff.players)), payoff.players, rotation=90, fontsize=7)
    ax.set_yticks(range(len(payoff.players)), payoff.players, fontsize=7)
    ax.set_xlabel("opponent")
    ax.set_ylabel("player")
    fig.colorbar(image, ax=ax, label="win rate of the row's player (a draw half; grey: no games)")
    fig.tight_layout()
    path = os.path.join(experiment_dir, "payoff.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.isfile(os.path.join(sys.argv[1], FILE)):
        sys.exit(f"usage: python -m sf_engine.selfplay.payoff EXPERIMENT_DIR (a folder with {FILE})")
    print(draw(sys.argv[1]))
