"""Do the ratings rank players of known strength? A random player, a trained Connect Four policy and the scripted
player, round robin (--games per pair, seats swapped), every game rated in one openskill rating as training rates.

  python perf/ratings_order.py --experiment DIR/pfsp   # a Connect Four experiment (perf/opponent_sampling.py keeps 2)
Prints one JSON line: each player's rating and each pair's wins, draws and losses.
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", required=True, help="a Connect Four experiment directory")
    parser.add_argument("--games", type=int, default=100, help="games per pair")
    args = parser.parse_args()
    from pettingzoo.classic import connect_four_v3

    import sf_engine
    from sf_engine.envs.opponents import connect_four_heuristic, play_game
    from sf_engine.envs.spec import TO_MOVE_KEY
    from sf_engine.selfplay.ratings import round_robin

    policy, rng = sf_engine.load_policy(args.experiment), np.random.default_rng(0)

    def trained(observation):  # its greedy move, as enjoy.py --deterministic plays it (to move: the engine's entry)
        batch = {key: np.asarray(value)[None] for key, value in observation.items()} | {TO_MOVE_KEY: np.ones((1, 1))}
        return int(np.asarray(policy.act(batch))[0])

    def random_player(observation):
        return int(rng.choice(np.flatnonzero(observation["action_mask"])))

    names, players = ["random", "trained", "scripted"], [random_player, trained, connect_four_heuristic]
    env = connect_four_v3.env()
    ratings, results = round_robin(3, args.games, lambda a, b, game: play_game(env, players[a], players[b], game))
    pairs = {f"{names[a]} vs {names[b]}": results[a, b].tolist() for a, b in [(0, 1), (1, 2), (0, 2)]}
    print(
        json.dumps(
            {
                "experiment": args.experiment,
                "ratings": {
                    name: [round(ratings[i].mu, 2), round(ratings[i].sigma, 2)] for i, name in enumerate(names)
                },
                "wins_draws_losses": pairs,
            }
        )
    )


if __name__ == "__main__":
    main()
