"""Small PettingZoo envs for the tests (--env toy_multiagent:Name with tests/ on the path)."""

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.agent_selector import AgentSelector

RELAY_MOVES = 4
RELAY_CORRECT = {"first": 1, "second": 0}  # the action that pays each seat


def _start_turns(env) -> None:
    """An AECEnv's books at reset: every agent in, no reward, none done."""
    env.agents = list(env.possible_agents)
    env.rewards = {a: 0.0 for a in env.agents}
    env._cumulative_rewards = {a: 0.0 for a in env.agents}
    env.terminations = {a: False for a in env.agents}
    env.truncations = {a: False for a in env.agents}
    env.infos = {a: {} for a in env.agents}


class RelayGame(AECEnv):
    """Two players move in turn, four moves in all (first, second, first, second). An agent's move pays
    it 1 when it is its seat's correct action (RELAY_CORRECT), but the pay arrives with the opponent's
    next move (the last move pays both at once): every reward but the last reaches an agent while it
    waits. The observation: [is first, is second, moves made / 4]. The best return per agent is 2."""

    metadata = {"name": "relay_v0", "is_parallelizable": False}

    def __init__(self, render_mode=None):
        super().__init__()
        self.possible_agents = ["first", "second"]
        self.render_mode = render_mode
        self.observation_spaces = {a: spaces.Box(0.0, 1.0, (3,), np.float32) for a in self.possible_agents}
        self.action_spaces = {a: spaces.Discrete(2) for a in self.possible_agents}
        self.log = []  # (move, mover, rewards of the step) of every move, for the tests

    def observation_space(self, agent):
        return self.observation_spaces[agent]

    def action_space(self, agent):
        return self.action_spaces[agent]

    def observe(self, agent):
        return np.array([agent == "first", agent == "second", self.moves / RELAY_MOVES], np.float32)

    def reset(self, seed=None, options=None):
        _start_turns(self)
        self._selector = AgentSelector(self.agents)
        self.agent_selection = self._selector.reset()
        self.moves, self.last_action = 0, {}

    def step(self, action):
        if self.terminations[self.agent_selection] or self.truncations[self.agent_selection]:
            return self._was_dead_step(action)
        mover = self.agent_selection
        other = "second" if mover == "first" else "first"
        self.rewards = {a: 0.0 for a in self.agents}
        if other in self.last_action:
            self.rewards[other] = float(self.last_action[other] == RELAY_CORRECT[other])
        self.last_action[mover] = int(action)
        self.moves += 1
        if self.moves == RELAY_MOVES:
            self.rewards[mover] += float(int(action) == RELAY_CORRECT[mover])
            self.terminations = {a: True for a in self.agents}
        self.log.append((self.moves, mover, dict(self.rewards)))
        self._accumulate_rewards()
        self.agent_selection = self._selector.next()


class VanishingParallel(ParallelEnv):
    """Three agents act at once; 'short' leaves after 2 steps, the others after 4. Each gets 1 per step,
    plus 1 when its action is 1. Observation: [steps / 4, agent index / 2]."""

    metadata = {"name": "vanishing_v0"}
    LIFETIME = {"a": 4, "short": 2, "c": 4}

    def __init__(self, render_mode=None):
        self.possible_agents = ["a", "short", "c"]
        self.render_mode = render_mode

    def observation_space(self, agent):
        return spaces.Box(0.0, 1.0, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def _obs(self, agent):
        return np.array([self.steps / 4, self.possible_agents.index(agent) / 2], np.float32)

    def reset(self, seed=None, options=None):
        self.agents, self.steps = list(self.possible_agents), 0
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.steps += 1
        rewards = {a: 1.0 + float(actions[a] == 1) for a in self.agents}
        terminations = {a: self.steps >= self.LIFETIME[a] for a in self.agents}
        obs = {a: self._obs(a) for a in self.agents}
        truncations, infos = {a: False for a in self.agents}, {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not terminations[a]]
        return obs, rewards, terminations, truncations, infos


class MixedSpacesParallel(VanishingParallel):
    """One agent sees a different observation space: its rows could not share a batch."""

    def observation_space(self, agent):
        return spaces.Box(0.0, 1.0, (3 if agent == "c" else 2,), np.float32)


class CueParallel(ParallelEnv):
    """Two agents act at once for CUE_STEPS steps. Each observes a Dict: a Discrete cue (one of 3, drawn anew for
    each agent and step), its seat as Discrete(2, start=1) and a nested Dict holding the time left as a Box. Its
    action is a Tuple of a Discrete(3) and a MultiBinary(2): the Discrete pays 1 when it names the cue, each bit 0.5
    when it equals the seat's pattern (CUE_BITS). The best return per agent is 2 x CUE_STEPS."""

    metadata = {"name": "cue_v0"}
    CUE_STEPS = 8
    CUE_BITS = {"left": (1, 0), "right": (0, 1)}

    def __init__(self, render_mode=None):
        self.possible_agents = ["left", "right"]
        self.render_mode = render_mode
        self._rng = np.random.default_rng(0)

    def observation_space(self, agent):
        return spaces.Dict(
            {
                "cue": spaces.Discrete(3),
                "seat": spaces.Discrete(2, start=1),
                "clock": spaces.Dict({"left": spaces.Box(0.0, 1.0, (1,), np.float32)}),
            }
        )

    def action_space(self, agent):
        return spaces.Tuple((spaces.Discrete(3), spaces.MultiBinary(2)))

    def _obs(self):
        self.cues = {a: int(self._rng.integers(3)) for a in self.possible_agents}
        left = np.array([1.0 - self.steps / self.CUE_STEPS], np.float32)
        seats = {a: 1 + self.possible_agents.index(a) for a in self.possible_agents}
        return {a: {"cue": self.cues[a], "seat": seats[a], "clock": {"left": left}} for a in self.agents}

    def reset(self, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents, self.steps = list(self.possible_agents), 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        self.steps += 1
        rewards = {}
        for a, (choice, bits) in actions.items():
            rewards[a] = float(int(choice) == self.cues[a]) + 0.5 * float(np.sum(np.asarray(bits) == self.CUE_BITS[a]))
        over = self.steps >= self.CUE_STEPS
        obs = self._obs()
        terminations = {a: over for a in self.agents}
        truncations, infos = {a: False for a in self.agents}, {a: {} for a in self.agents}
        if over:
            self.agents = []
        return obs, rewards, terminations, truncations, infos


def relay_game():
    return RelayGame()


def cue_game():
    return CueParallel()


def vanishing():
    return VanishingParallel()


def mixed_spaces():
    return MixedSpacesParallel()


def relay_correct_policy(observation) -> int:
    """A scripted player of RelayGame that always makes its seat's correct move."""
    return RELAY_CORRECT["first"] if observation[0] else RELAY_CORRECT["second"]


class DropoutGame(AECEnv):
    """Three players in turn (a, b, c, a, ...); 'c' is knocked out by a's first move, while it waits
    (reward -1), and stays in `agents` while b moves, until it is selected and stepped out; the game
    ends after 6 moves by a and b. Observation: [moves / 6]."""

    metadata = {"name": "dropout_v0", "is_parallelizable": False}

    def __init__(self, render_mode=None):
        super().__init__()
        self.possible_agents = ["a", "b", "c"]
        self.render_mode = render_mode

    def observation_space(self, agent):
        return spaces.Box(0.0, 1.0, (1,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def observe(self, agent):
        return np.array([self.moves / 6], np.float32)

    def reset(self, seed=None, options=None):
        _start_turns(self)
        self.agent_selection, self.moves = "a", 0

    def step(self, action):
        if self.terminations[self.agent_selection] or self.truncations[self.agent_selection]:
            return self._was_dead_step(action)
        self.rewards = {a: 0.0 for a in self.agents}
        mover = self.agent_selection
        self.moves += 1
        self.rewards[mover] = 1.0
        if self.moves == 1:
            self.terminations["c"], self.rewards["c"] = True, -1.0
        if self.moves == 6:
            self.terminations = {a: True for a in self.agents}
        self._accumulate_rewards()
        order = [a for a in self.possible_agents if a in self.agents]
        here = order.index(mover)
        upcoming = order[(here + 1) % len(order)]
        if self.terminations[upcoming] and self.moves < 6:  # a knocked-out agent is stepped out first
            self._skip_agent_selection = order[(here + 2) % len(order)]
        self.agent_selection = upcoming


def dropout_game():
    return DropoutGame()
