"""Two-player games against an opponent: `enjoy.py --opponent` and the evaluator's win rate against a
random player (train.py --eval_every_sec on a two-player PettingZoo env).

The trained policy plays one seat, the opponent the other, the seats swapping from one game to the
next, so that both are played equally. Opponents (`make_opponent`):
  random           a uniformly random legal action (the observation's action mask, where it has one);
  MODULE:FUNCTION  FUNCTION(observation) -> action, called with the env's own observation of its seat
                   (as PettingZoo gives it: for classic games the dict with 'observation' and
                   'action_mask');
  a checkpoint     another policy trained on the same env (its file is loaded as data, never run), playing
                   as the policy does: its greedy action with --deterministic, else a sampled one.
A game is won when the policy's return is above the opponent's, drawn when equal, lost when below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from sf_engine.envs.masks import random_actions
from sf_engine.model.actor_critic import obs_tensors
from sf_engine.play.episodes import act


class OpponentError(ValueError):
    """A --opponent the engine cannot play against: one line naming it and the fix."""


class Opponent:
    """actions(env, rows, obs) -> the opponent's actions [len(rows)] for those rows of `env` (a
    MultiAgentBatchEnv) whose agents it plays; `obs` is the batch's observation arrays."""

    def __init__(self, name: str, spec, choose):
        self.name, self.spec, self._choose = name, spec, choose

    def actions(self, env, rows: np.ndarray, obs: dict) -> np.ndarray:
        return self._choose(env, rows, obs)


def make_opponent(
    text: str, spec, load_policy=None, device="cpu", seed: int = 0, deterministic: bool = True
) -> Opponent:
    """The opponent a --opponent value names (see the module's docstring), or OpponentError.
    `load_policy(path)`: the policy of a checkpoint file (or an error to report), for that kind, which plays its
    greedy action when `deterministic`, else samples it (as the policy it meets does)."""
    if text == "random":
        rng = np.random.default_rng(seed)
        return Opponent("random", spec, lambda env, rows, obs: random_actions(spec, obs, rng, rows))
    if ":" in text and not text.endswith((".pt", ".pth")):
        function = _import_function(text)
        start = int(spec.action.start[0]) if spec.action.kind == "discrete" and spec.action.start else 0

        def call(env, rows, obs):  # the env's own action values, back to the policy's 0..n-1
            return np.array([np.asarray(function(env.raw_observation(int(row)))) - start for row in rows])

        return Opponent(text, spec, call)
    return _checkpoint_opponent(text, spec, load_policy, device, deterministic)


def _import_function(text: str):
    """MODULE:FUNCTION, imported as `--env module:attr` is (sf_engine.envs.user_code: the current directory first)."""
    from sf_engine.envs.user_code import import_user_module, user_attribute

    function = user_attribute(import_user_module(text, "--opponent", OpponentError), text, "--opponent", OpponentError)
    if not callable(function):
        raise OpponentError(f"--opponent {text}: {text.partition(':')[2]} is not a function of an observation")
    return function


def _checkpoint_opponent(path: str, spec, load_policy, device, deterministic: bool) -> Opponent:
    import os

    if not os.path.isfile(path) or load_policy is None:
        raise OpponentError(f"--opponent {path}: no such file; give random, MODULE:FUNCTION or a checkpoint file")
    try:
        policy = load_policy(path)
    except Exception as exc:  # the loader's own error, as one line
        raise OpponentError(f"--opponent {exc}") from None
    if policy.recurrent:
        raise OpponentError(
            f"--opponent {path}: a recurrent policy cannot be an opponent yet (it would play "
            f"without its memory); give a feed-forward one, random or MODULE:FUNCTION"
        )

    def choose(env, rows, obs):
        with torch.inference_mode():
            actions, _ = act(policy, obs_tensors({k: v[rows] for k, v in obs.items()}, device), None, deterministic)
        return actions.cpu().numpy()

    return Opponent(os.path.basename(path), spec, choose)


def play_matches(
    policy,
    env,
    opponent: Opponent,
    num_games: int,
    deterministic: bool = True,
    device="cpu",
    max_steps: int = 100_000,
    should_stop=lambda: False,
) -> dict:
    """Play `num_games` whole games of a two-player `env` (a MultiAgentBatchEnv of G games) between
    `policy` (feed-forward or recurrent) and `opponent`. Game k is planned before any is played: the
    policy takes seat k mod 2, in env game k mod G, so the seats are played equally whatever the games'
    lengths, and every planned game counts. Returns {games, wins, draws, losses, win_rate, draw_rate,
    loss_rate, return_mean, return_std, length_mean, games_per_seat}."""
    num_agents, slots = env.num_agents, env.num_games
    obs = env.reset()
    game = np.arange(slots)  # the planned game each env game plays (>= num_games: none, idle)
    returns = np.zeros(env.num_envs)
    lengths = np.zeros(slots, np.int64)
    resetting = np.zeros(slots, bool)
    state = policy.initial_state(env.num_envs, device)
    seats = np.tile(np.arange(num_agents), slots)
    results, steps = {}, 0
    while len(results) < num_games and steps < max_steps and not should_stop():
        ours = (game % num_agents).repeat(num_agents) == seats
        with torch.inference_mode():
            actions, state = act(policy, obs_tensors(obs, device), state, deterministic)
        actions = actions.cpu().numpy().copy()
        theirs = np.flatnonzero(~ours & env.acting)
        if len(theirs):
            actions[theirs] = opponent.actions(env, theirs, obs)
        result = env.step(actions)
        returns += result.rewards * ~resetting.repeat(num_agents)
        lengths += ~resetting
        over = env.game_over
        for slot in np.flatnonzero(over):
            rows = slice(slot * num_agents, (slot + 1) * num_agents)
            seat = game[slot] % num_agents
            if game[slot] < num_games:
                mine, others = returns[rows][seat], np.delete(returns[rows], seat)
                results[int(game[slot])] = GameResult(int(seat), mine, np.sign(mine - others.max()), int(lengths[slot]))
            returns[rows], lengths[slot] = 0.0, 0
            game[slot] += slots
        if state is not None:  # a new game starts the policy's state over
            state = state * torch.as_tensor(~(over | resetting).repeat(num_agents), device=state.device).unsqueeze(-1)
        resetting, obs = over, result.obs
        steps += 1
    return summarize([results[k] for k in sorted(results)], num_agents)


class GameResult(NamedTuple):
    """One finished game, from the policy's seat: its return, the outcome's sign (1 won, 0 drawn, -1
    lost) and the game's length in steps."""

    seat: int
    return_: float
    outcome: float
    length: int


@dataclass
class MatchFigures:
    """The figures of a match of games against an opponent (enjoy.py --opponent prints them as JSON)."""

    games: int
    wins: int
    draws: int
    losses: int
    win_rate: float
    draw_rate: float
    loss_rate: float
    return_mean: float
    return_std: float
    length_mean: float
    games_per_seat: list
    # the match's ratings (sf_engine.selfplay.ratings; None without openskill): both players start new and are
    # rated game by game, so they say how far apart the two are, on the scale of the run's ratings
    rating_mu: float | None = None
    rating_sigma: float | None = None
    opponent_rating_mu: float | None = None
    opponent_rating_sigma: float | None = None


def summarize(results: list, num_agents: int) -> MatchFigures:
    """The figures of a match's GameResults."""
    outcome = np.array([r.outcome for r in results]) if results else np.zeros(0)
    games = max(len(results), 1)
    returns = np.array([r.return_ for r in results]) if results else np.zeros(1)
    return MatchFigures(
        games=len(results),
        wins=int((outcome > 0).sum()),
        draws=int((outcome == 0).sum()),
        losses=int((outcome < 0).sum()),
        win_rate=float((outcome > 0).sum() / games),
        draw_rate=float((outcome == 0).sum() / games),
        loss_rate=float((outcome < 0).sum() / games),
        return_mean=float(returns.mean()),
        return_std=float(returns.std()),
        length_mean=float(np.mean([r.length for r in results])) if results else 0.0,
        games_per_seat=[int(sum(1 for r in results if r.seat == s)) for s in range(num_agents)],
        **_match_ratings(outcome),
    )


def _match_ratings(outcome: np.ndarray) -> dict:
    """The ratings of the policy and its opponent after the games of `outcome` (1 won, 0 drawn, -1 lost), in order."""
    from sf_engine.selfplay.ratings import DRAW, Ratings, RatingsUnavailable

    try:
        ratings = Ratings(2)
    except RatingsUnavailable:
        return {}
    for sign in outcome:
        ratings.rate(0, 1, DRAW - int(sign))  # 1 -> WIN, 0 -> DRAW, -1 -> LOSS
    ours, theirs = ratings[0], ratings[1]
    return {
        "rating_mu": ours.mu,
        "rating_sigma": ours.sigma,
        "opponent_rating_mu": theirs.mu,
        "opponent_rating_sigma": theirs.sigma,
    }
