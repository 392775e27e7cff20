"""A league (Vinyals et al. 2019, AlphaStar): trained players of three roles and the frozen snapshots of them, each
role with its own opponents and its own rule for when it is frozen into the league.

  main agent        35% of its games against itself, 50% against every snapshot by PFSP (weight (1 - x)^2, x its
                    win rate against the snapshot), 15% against the snapshots of main exploiters and the main agent's
                    own it no longer beats 70% of the time, by PFSP too (back to itself while there are none);
  main exploiter    the main agent as it is now, while it wins at least 10% of those games; below that, the main
                    agent's snapshots, those at its level first (weight x (1 - x));
  league exploiter  every snapshot, by PFSP.
A trained player is frozen into the league (a snapshot of it joins the pool): the main agent every so many versions,
an exploiter once it wins 70% of its games since its previous snapshot (a draw half, over at least FREEZE_MIN_GAMES)
or after that many versions whatever its games; then a main exploiter starts over from its first weights, a league
exploiter does with chance RESET_CHANCE, and the main agent goes on.
"""

from __future__ import annotations

import numpy as np

from sf_engine.selfplay.ratings import DRAW, WIN
from sf_engine.selfplay.sampling import sampling_weights

ROLES = ("main_agent", "main_exploiter", "league_exploiter")  # trained policy ids 0, 1, 2
MAIN_AGENT, MAIN_EXPLOITER, LEAGUE_EXPLOITER = range(3)
SELF_PLAY, AGAINST_ALL, AGAINST_HARD = 0.35, 0.50, 0.15  # the main agent's games
BEATEN = 0.7  # a snapshot of the main agent it beats this often is not among its hard ones
EXPLOITER_FLOOR = 0.1  # below this win rate against the main agent, a main exploiter turns to its snapshots
FREEZE_MIN_GAMES = 100
RESET_CHANCE = 0.25  # a league exploiter's, each time it is frozen
EMPTY = -1  # the source of a pool slot that holds no snapshot yet


def match_chances(win_rates: np.ndarray, sources: np.ndarray) -> np.ndarray:
    """[trained, players]: the chance of each player to be a trained player's opponent in a game it leads.
    `win_rates` [trained, players]: each trained player's win rate against each player; `sources` [players]: the
    role a player is or copies (the trained players: their own; a pool slot: its snapshot's, EMPTY when none)."""
    trained, players = win_rates.shape
    snapshots = np.flatnonzero((np.arange(players) >= trained) & (sources != EMPTY))
    chances = np.zeros((trained, players))
    main = chances[MAIN_AGENT]
    main[MAIN_AGENT] = SELF_PLAY
    _spread(main, snapshots, win_rates[MAIN_AGENT], AGAINST_ALL, "pfsp_hard", fallback=MAIN_AGENT)
    hard = [
        s
        for s in snapshots
        if sources[s] == MAIN_EXPLOITER or (sources[s] == MAIN_AGENT and win_rates[MAIN_AGENT, s] < BEATEN)
    ]
    _spread(main, np.array(hard, np.int64), win_rates[MAIN_AGENT], AGAINST_HARD, "pfsp_hard", fallback=MAIN_AGENT)
    if trained > MAIN_EXPLOITER:
        of_main = snapshots[sources[snapshots] == MAIN_AGENT]
        exploiter = chances[MAIN_EXPLOITER]
        if win_rates[MAIN_EXPLOITER, MAIN_AGENT] >= EXPLOITER_FLOOR or not len(of_main):
            exploiter[MAIN_AGENT] = 1.0
        else:
            _spread(exploiter, of_main, win_rates[MAIN_EXPLOITER], 1.0, "pfsp_var", fallback=MAIN_AGENT)
    if trained > LEAGUE_EXPLOITER:
        _spread(chances[LEAGUE_EXPLOITER], snapshots, win_rates[LEAGUE_EXPLOITER], 1.0, "pfsp_hard", MAIN_AGENT)
    return chances


def _spread(row: np.ndarray, players: np.ndarray, win_rates: np.ndarray, share: float, how: str, fallback: int):
    """`share` of `row` over `players` by the weighting `how` of their win rates (all of it to `fallback` when
    there are none)."""
    if len(players):
        row[players] += share * sampling_weights(win_rates[players], how)
    else:
        row[fallback] += share


def freeze_due(role: int, results: np.ndarray, versions_since: int, win_rate: float, max_versions: int) -> bool:
    """Whether a trained player of `role` is frozen now: `results` its (WIN, DRAW, LOSS) counts since its previous
    snapshot, `versions_since` its versions since then. The main agent is frozen every `max_versions` versions; an
    exploiter once it wins `win_rate` of its games (a draw half, over at least FREEZE_MIN_GAMES), or after
    `max_versions` versions."""
    if versions_since >= max_versions:
        return True
    games = results.sum()
    won = (results[WIN] + 0.5 * results[DRAW]) / games if games else 0.0
    return bool(role != MAIN_AGENT and games >= FREEZE_MIN_GAMES and won >= win_rate)


def starts_over(role: int, rng: np.random.Generator) -> bool:
    """Whether a trained player of `role` starts over from its first weights once frozen."""
    return role == MAIN_EXPLOITER or (role == LEAGUE_EXPLOITER and rng.random() < RESET_CHANCE)
