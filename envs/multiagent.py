"""Multi-agent envs (PettingZoo): every agent of every game is a row of the batch.

A factory that returns a PettingZoo `ParallelEnv` (every agent acts each step) or `AECEnv` (turn-based:
only the agent to move acts) makes a multi-agent run. Game g's agent i (in `possible_agents` order) is
row g x A + i of a batch of num_games x A rows, so the engine's buffers, policy worker and learner see
rows as they see single-agent envs. Per row and step the batch reports:
  alive   the agent is in the game at the returned observation (else its row is absent: zeros,
          never acted for, never trained on);
  acting  it is the agent's turn (turn-based games; in a ParallelEnv every live agent acts); a
          turn-based game's rows also observe it, as the entry TO_MOVE_KEY (1.0 or 0.0): a board
          seen from one side does not always say whose move it is, and the value of a waiting
          agent's state is not that of the same board with its move to come;
  rewards whatever the env gave that agent at this step, whoever moved: in a turn-based game the
          reward of the opponent's winning move reaches the loser's row at that step.
A game is over when no agent is left in it (a ParallelEnv removes its finished agents) or, for an
AECEnv, when every agent in it is done; like every batch of the engine it is reset on the next step
(Gymnasium's next-step reset), whose row is marked invalid.
All agents must have the same observation and action spaces (one policy batches their rows). An observation with
Discrete, text or nested parts is written as its ObsLayout's flat entries, as a single-agent env's is.
"""

from __future__ import annotations

import numpy as np

from .batch import StepResult
from .spec import TO_MOVE_KEY, EnvSpec


def is_multiagent(env) -> bool:
    """A PettingZoo env (ParallelEnv or AECEnv), told by its API rather than its class, so that pettingzoo
    is imported only where it is installed and used."""
    return (
        hasattr(env, "possible_agents")
        and callable(getattr(env, "observation_space", None))
        and not hasattr(env, "single_observation_space")
    )


def is_turn_based(env) -> bool:
    return hasattr(env, "agent_selection")


def is_pettingzoo_class(target) -> bool:
    """A PettingZoo env class (given as --env module:Class): one of its bases comes from pettingzoo."""
    return isinstance(target, type) and any(c.__module__.split(".")[0] == "pettingzoo" for c in target.__mro__)


def probe_spaces(env_id: str, env, error) -> tuple:
    """(observation space, action space, agent names, turn based) of a PettingZoo env; `error` with one
    line where its agents' spaces differ (their rows could not share one batch and one policy)."""
    agents = tuple(str(a) for a in env.possible_agents)
    if not agents:
        raise error(f"--env {env_id}: the PettingZoo env has no possible_agents")
    obs_space, action_space = env.observation_space(env.possible_agents[0]), env.action_space(env.possible_agents[0])
    for agent in env.possible_agents[1:]:
        for kind, first, other in (
            ("observation", obs_space, env.observation_space(agent)),
            ("action", action_space, env.action_space(agent)),
        ):
            if other != first:
                raise error(
                    f"--env {env_id}: agents {agents[0]!r} and {agent!r} have different {kind} spaces "
                    f"({first} vs {other}); the engine batches agents that share their spaces (pad them "
                    f"to one space with a wrapper, e.g. SuperSuit's pad_observations_v0/pad_action_space_v0)"
                )
    try:
        env.reset(seed=0)
    except Exception as exc:  # a user's env: any failure is reported as such
        raise error(f"--env {env_id}: reset() raised {exc.__class__.__name__}: {exc}") from None
    return obs_space, action_space, agents, is_turn_based(env)


class MultiAgentBatchEnv:
    """`num_envs` rows = num_envs / A games of a PettingZoo env, A = its possible agents; the interface of
    envs.batch.BatchEnv (reset, step, render, close) plus `alive` and `acting` [num_envs] after each."""

    def __init__(self, factory, num_envs: int, spec: EnvSpec, seed: int, render_mode=None):
        self.spec, self.num_envs, self.agents = spec, num_envs, spec.agents
        self.num_agents = len(self.agents)
        if num_envs < self.num_agents or num_envs % self.num_agents:
            raise ValueError(f"{num_envs} rows do not make whole games of {self.num_agents} agents")
        self.num_games = num_envs // self.num_agents
        kwargs = {"render_mode": render_mode} if render_mode else {}
        self.games = [factory(**kwargs) for _ in range(self.num_games)]
        self.turn_based = spec.turn_based
        self.seed = seed
        self.row_of = {agent: i for i, agent in enumerate(self.agents)}
        self.obs = {key: np.zeros((num_envs,) + tuple(shape), dtype) for key, shape, dtype in spec.obs}
        self.alive = np.zeros(num_envs, bool)
        self.acting = np.zeros(num_envs, bool)
        self._over = np.zeros(self.num_games, bool)
        self._raw = [{} for _ in range(self.num_games)]  # ParallelEnv: each game's latest obs per agent
        self._gone = [set() for _ in range(self.num_games)]  # AECEnv: agents reported done, not yet stepped out
        self._stats: list = []  # (row, episode_extra_stats) given by this step's infos (ParallelEnv)

    def _write_obs(self, game: int, agent, value) -> None:
        row = game * self.num_agents + self.row_of[str(agent)]
        if self.spec.layout is not None:  # Discrete, text or nested parts: the flat entries (envs.observations)
            value = self.spec.layout.one(value)
        if isinstance(value, dict):
            for key, array in self.obs.items():
                if key != TO_MOVE_KEY:
                    array[row] = value[key]
        else:
            self.obs["obs"][row] = value

    def _clear_game(self, game: int) -> slice:
        rows = slice(game * self.num_agents, (game + 1) * self.num_agents)
        for array in self.obs.values():
            array[rows] = 0
        self.alive[rows] = False
        self.acting[rows] = False
        return rows

    def _reset_game(self, game: int, seed=None) -> None:
        env = self.games[game]
        self._clear_game(game)
        result = env.reset(seed=seed)
        if self.turn_based:
            for agent in env.agents:
                self._write_obs(game, agent, env.observe(agent))
        else:
            self._raw[game] = result[0]
            for agent, value in result[0].items():
                self._write_obs(game, agent, value)
        self._gone[game] = set()
        self._mark_live(game)
        self._over[game] = False

    def _mark_live(self, game: int) -> None:
        env, base = self.games[game], game * self.num_agents
        for agent in env.agents:
            if agent not in self._gone[game]:
                self.alive[base + self.row_of[str(agent)]] = True
        if self.turn_based:
            if env.agents:
                self.acting[base + self.row_of[str(env.agent_selection)]] = True
            rows = slice(base, base + self.num_agents)
            self.obs[TO_MOVE_KEY][rows, 0] = self.acting[rows]
        else:
            self.acting[base : base + self.num_agents] = self.alive[base : base + self.num_agents]

    def reset(self) -> dict:
        for game in range(self.num_games):
            self._reset_game(game, seed=self.seed + game)
        return self.obs

    def step(self, actions: np.ndarray) -> StepResult:
        n = self.num_envs
        rewards, terminated, truncated = np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool)
        for game in range(self.num_games):
            if self._over[game]:  # the step after a game's end resets it; its action is ignored
                self._reset_game(game)
                continue
            base = game * self.num_agents
            step = self._step_turn if self.turn_based else self._step_parallel
            step(game, actions[base : base + self.num_agents], rewards[base:], terminated[base:], truncated[base:])
        over = terminated | truncated
        extra, objective = self._episode_stats()
        return StepResult(
            self.obs,
            rewards,
            terminated,
            truncated,
            rewards,
            over,
            extra,
            alive=self.alive.copy(),
            acting=self.acting.copy(),
            objective=objective,
        )

    def _episode_stats(self) -> tuple:
        """(name -> values, objective [E] NaN where none) of the agents whose episode_extra_stats a
        ParallelEnv's step gave (Sample Factory's convention: frags, true_objective, ...), or (None, None)."""
        if not self._stats:
            return None, None
        extra, objective = {}, np.full(self.num_envs, np.nan)
        for row, stats in self._stats:
            for name, value in stats.items():
                extra.setdefault(name, []).append(float(value))
            if "true_objective" in stats:
                objective[row] = float(stats["true_objective"])
        self._stats = []
        return extra, objective if np.isfinite(objective).any() else None

    def _step_parallel(self, game: int, actions, rewards, terminated, truncated) -> None:
        env = self.games[game]
        moves = {agent: self.spec.action.env_action(actions[self.row_of[str(agent)]]) for agent in env.agents}
        obs, step_rewards, terms, truncs, infos = env.step(moves)
        self._raw[game] = obs
        self._clear_game(game)
        for agent in moves:
            i = self.row_of[str(agent)]
            stats = (infos.get(agent) or {}).get("episode_extra_stats")
            if isinstance(stats, dict):
                self._stats.append((game * self.num_agents + i, stats))
            rewards[i] = step_rewards.get(agent, 0.0)
            terminated[i], truncated[i] = bool(terms.get(agent, False)), bool(truncs.get(agent, False))
        for agent, value in obs.items():  # an agent that finished keeps its last obs (a truncation bootstraps)
            self._write_obs(game, agent, value)
        self._mark_live(game)
        self._over[game] = not env.agents

    def _step_turn(self, game: int, actions, rewards, terminated, truncated) -> None:
        """The agent to move acts; every agent's reward of this step is credited to its own row; an agent
        the step ended keeps its last obs, is reported done once and leaves the game (PettingZoo's None
        action, when it is selected)."""
        env, gone = self.games[game], self._gone[game]
        env.step(self.spec.action.env_action(actions[self.row_of[str(env.agent_selection)]]))
        self._clear_game(game)
        playing = [agent for agent in env.agents if agent not in gone]
        for agent in playing:
            i = self.row_of[str(agent)]
            rewards[i] = env.rewards.get(agent, 0.0)
            terminated[i], truncated[i] = bool(env.terminations.get(agent)), bool(env.truncations.get(agent))
            if terminated[i] or truncated[i]:
                gone.add(agent)
                self._write_obs(game, agent, env.observe(agent))
        self._over[game] = all(agent in gone for agent in env.agents)
        if self._over[game]:
            return
        while env.agents and env.agent_selection in gone:
            gone.discard(env.agent_selection)
            env.step(None)  # a finished agent leaves the game; the others play on
        for agent in env.agents:
            if agent not in gone:
                self._write_obs(game, agent, env.observe(agent))
        self._mark_live(game)

    @property
    def game_over(self) -> np.ndarray:
        """[num_games]: the game ended at the latest step (it resets at the next)."""
        return self._over.copy()

    def raw_observation(self, row: int):
        """The env's own observation of row's agent, as PettingZoo gives it (None where it has none)."""
        game, seat = divmod(row, self.num_agents)
        env, agent = self.games[game], self.agents[seat]
        if self.turn_based:
            return env.observe(next(a for a in env.agents if str(a) == agent)) if self.alive[row] else None
        return next((value for a, value in self._raw[game].items() if str(a) == agent), None)

    def render(self):
        return [self.games[0].render()]

    @property
    def render_fps(self):
        return getattr(self.games[0], "metadata", {}).get("render_fps")

    def close(self) -> None:
        for env in self.games:
            env.close()
