"""Scripted opponents for evaluation (`enjoy.py --opponent sf_engine.envs.opponents:NAME`): functions of the env's
own observation of their seat, as PettingZoo gives it, returning an action; and one game between two such players."""

from __future__ import annotations

import numpy as np

_RNG = np.random.default_rng(2026)
ROWS, COLUMNS = 6, 7


def _drop_row(board: np.ndarray, column: int) -> int:
    """The row a piece dropped in `column` lands on (row 0 is the top), or -1 when the column is full."""
    empty = np.flatnonzero(board[:, column] == 0)
    return int(empty[-1]) if len(empty) else -1


def _wins(pieces: np.ndarray, row: int, column: int) -> bool:
    """Whether a piece at (row, column) completes four in a line of `pieces` [6, 7] (0/1)."""
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        count = 1
        for sign in (1, -1):
            r, c = row + sign * dr, column + sign * dc
            while 0 <= r < ROWS and 0 <= c < COLUMNS and pieces[r, c]:
                count += 1
                r, c = r + sign * dr, c + sign * dc
        if count >= 4:
            return True
    return False


def connect_four_tactics(observation: dict) -> tuple:
    """PettingZoo connect_four_v3, the mover's observation [6, 7, 2] (plane 0 the mover's pieces, plane 1
    the opponent's): (the legal columns that win at once, those where the opponent would win next)."""
    planes, legal = np.asarray(observation["observation"]), np.flatnonzero(observation["action_mask"])
    mine, theirs = planes[:, :, 0], planes[:, :, 1]
    board = mine + theirs
    return (
        [int(c) for c in legal if _wins(mine, _drop_row(board, c), c)],
        [int(c) for c in legal if _wins(theirs, _drop_row(board, c), c)],
    )


def connect_four_heuristic(observation: dict) -> int:
    """PettingZoo connect_four_v3: win when a move wins, else block a column where the opponent would
    win next, else a random legal column."""
    wins, blocks = connect_four_tactics(observation)
    if wins or blocks:  # first a win of our own, then the opponent's to block
        return (wins or blocks)[0]
    return int(_RNG.choice(np.flatnonzero(observation["action_mask"])))


def play_game(env, first, second, seed: int) -> tuple:
    """One game of a two-player PettingZoo AEC env (Connect Four: player_0 moves first) between `first` in seat
    player_0 and `second` in seat player_1, each a function of its seat's observation returning a move: their
    returns."""
    env.reset(seed=seed)
    players, returns = {"player_0": first, "player_1": second}, {}
    for agent in env.agent_iter():
        observation, reward, terminated, truncated, _ = env.last()
        if terminated or truncated:
            returns[agent] = reward
        env.step(None if terminated or truncated else players[agent](observation))
    return returns["player_0"], returns["player_1"]
