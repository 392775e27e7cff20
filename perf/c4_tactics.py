"""Connect Four tactics of a trained checkpoint: how often its greedy move takes a win that is there, and
blocks the opponent's win where it must, in two kinds of positions.

  python perf/c4_tactics.py --experiment NAME [--checkpoint PATH] [--games 400]
Plays --games greedy games (both seats, half each) against the scripted player of envs/opponents.py
(wins when it can, blocks when it must, else a random column), then --games against a copy of itself
that samples its moves (the positions self-play trains on). For each set of games: the win rate, and
over the policy's own moves, the share of positions with a winning column where it took one
(`win_taken`) and, where it had none but the opponent threatened to win, the share where it blocked
(`blocked`). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sf_engine.envs import make_batch_env  # noqa: E402
from sf_engine.envs.opponents import connect_four_heuristic, connect_four_tactics  # noqa: E402
from sf_engine.model.actor_critic import obs_tensors  # noqa: E402
from sf_engine.play.loading import LoadError, load_experiment, load_policy  # noqa: E402
from sf_engine.runtime.checkpoint import latest_checkpoint  # noqa: E402

GAMES_AT_ONCE = 32


def play(policy, env, games: int, scripted: bool, rng) -> dict:
    """`games` games of the greedy policy against the scripted player (`scripted`) or its sampling self."""
    obs, slot_game = env.reset(), np.arange(GAMES_AT_ONCE)
    seats, returns = np.tile([0, 1], GAMES_AT_ONCE), np.zeros(env.num_envs)
    resetting, outcomes = np.zeros(GAMES_AT_ONCE, bool), []
    counts = dict.fromkeys(("win_chances", "wins_taken", "threats", "threats_blocked"), 0)
    while len(outcomes) < games:  # game k is played in slot k mod GAMES_AT_ONCE, seat k mod 2
        ours = (slot_game % 2).repeat(2) == seats
        with torch.inference_mode():
            logits, _ = policy(obs_tensors(obs))
            probs = torch.softmax(logits.float(), -1).numpy()
        actions = probs.argmax(-1)
        planned = (slot_game < games).repeat(2)  # moves of games beyond --games are not counted
        for row in np.flatnonzero(env.acting & ~resetting.repeat(2)):
            observation = env.raw_observation(int(row))
            if not ours[row]:
                actions[row] = (
                    connect_four_heuristic(observation)
                    if scripted
                    else rng.choice(len(probs[row]), p=probs[row] / probs[row].sum())
                )
                continue
            wins, blocks = connect_four_tactics(observation)
            if not planned[row]:
                continue
            if wins:
                counts["win_chances"] += 1
                counts["wins_taken"] += int(actions[row] in wins)
            elif blocks:
                counts["threats"] += 1
                counts["threats_blocked"] += int(actions[row] in blocks)
        result = env.step(actions)
        returns += result.rewards * ~resetting.repeat(2)
        for slot in np.flatnonzero(env.game_over):
            seat, pair = slot_game[slot] % 2, returns[2 * slot : 2 * slot + 2]
            if slot_game[slot] < games:
                outcomes.append(np.sign(pair[seat] - pair[1 - seat]))
            returns[2 * slot : 2 * slot + 2], slot_game[slot] = 0.0, slot_game[slot] + GAMES_AT_ONCE
        resetting, obs = env.game_over, result.obs
    outcomes = np.array(outcomes)
    return {
        "games": games,
        "win_rate": float((outcomes > 0).mean()),
        "draw_rate": float((outcomes == 0).mean()),
        "win_taken": round(counts["wins_taken"] / max(1, counts["win_chances"]), 3),
        "blocked": round(counts["threats_blocked"] / max(1, counts["threats"]), 3),
        **counts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--train_dir", default="train_dir")
    parser.add_argument("--checkpoint", default=None, help="a checkpoint file (default: the experiment's latest)")
    parser.add_argument("--games", type=int, default=400, help="games per opponent")
    args = parser.parse_args()
    try:
        cfg, spec, exp_dir = load_experiment(args.train_dir, args.experiment)
    except LoadError as exc:
        parser.error(str(exc))
    if cfg.env.env != "pettingzoo.classic.connect_four_v3:env":
        parser.error(f"--experiment {args.experiment} trained {cfg.env.env}; this script reads Connect Four boards")
    if cfg.model.rnn != "none":
        parser.error(f"--experiment {args.experiment} has a recurrent policy; this script plays feed-forward ones")
    path = args.checkpoint or latest_checkpoint(os.path.join(exp_dir, "checkpoints"))
    if path is None:
        parser.error(f"--experiment {args.experiment} has no checkpoint yet")
    try:
        policy = load_policy(cfg, spec, path, "cpu")
    except LoadError as exc:
        parser.error(str(exc))
    env = make_batch_env(cfg.env.env, cfg.env.env_backend, 2 * GAMES_AT_ONCE, seed=1, spec=spec, training=False)
    rng = np.random.default_rng(1)
    try:
        figures = {
            "scripted": play(policy, env, args.games, True, rng),
            "self_sampling": play(policy, env, args.games, False, rng),
        }
    finally:
        env.close()
    print(json.dumps({"experiment": args.experiment, "checkpoint": os.path.basename(path), **figures}))


if __name__ == "__main__":
    main()
