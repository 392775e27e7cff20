"""Small user-style envs for the tests (used as --env toy_envs:Name with tests/ on the path)."""

import os
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces

EPISODE_LENGTH = 5


class ToyDictEnv(gym.Env):
    """Dict observation (uint8 image + float vector), MultiDiscrete actions, 5-step episodes.
    The image's pixels all equal (10 * episode + step) % 256, so what arrives anywhere can be checked.
    Reward 1 when the first action component is 1."""

    def __init__(self, render_mode=None):
        self.observation_space = spaces.Dict(
            {"image": spaces.Box(0, 255, (3, 8, 8), np.uint8), "vector": spaces.Box(-1.0, 1.0, (2,), np.float32)}
        )
        self.action_space = spaces.MultiDiscrete([3, 2])
        self.episode, self.step_count = -1, 0

    def _obs(self):
        value = (10 * self.episode + self.step_count) % 256
        return {
            "image": np.full((3, 8, 8), value, np.uint8),
            "vector": np.array([self.step_count / EPISODE_LENGTH, -0.5], np.float32),
        }

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.step_count = self.episode + 1, 0
        return self._obs(), {}

    def step(self, action):
        self.step_count += 1
        reward = float(action[0] == 1)
        return self._obs(), reward, self.step_count >= EPISODE_LENGTH, False, {}


class BadResetEnv(ToyDictEnv):
    """reset() returns the observation alone (the old Gym API)."""

    def reset(self, seed=None, options=None):
        return super().reset(seed=seed)[0]


class DiscreteObsEnv(gym.Env):
    observation_space = spaces.Discrete(4)
    action_space = spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return 0, {}

    def step(self, action):
        return 0, 0.0, True, False, {}


class ToyHWCImageEnv(gym.Env):
    """A 7x7x3 uint8 image in [H, W, C] layout (as MiniGrid-style Gymnasium envs have), 3 actions."""

    def __init__(self, render_mode=None):
        self.observation_space = spaces.Box(0, 255, (7, 7, 3), np.uint8)
        self.action_space = spaces.Discrete(3)
        self.step_count = 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.step_count = 0
        return np.zeros((7, 7, 3), np.uint8), {}

    def step(self, action):
        self.step_count += 1
        obs = np.full((7, 7, 3), 40 * self.step_count, np.uint8)
        return obs, float(action == 2), self.step_count >= 6, False, {}


class SlowEnv(gym.Env):
    """A vector-observation env whose step waits 2 ms (a simulator behind I/O, say): it costs wall time,
    little CPU."""

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        time.sleep(0.002)
        return np.zeros(4, np.float32), 1.0, False, False, {}


class _FaultOnce(gym.Env):
    """A CartPole-sized env that misbehaves once per test run, on its FAULT_STEP-th step: the first
    env to get there creates the file named by $SF_TEST_FAULT_MARKER and misbehaves; envs made after
    that (the restarted worker's) behave. Without the variable it always misbehaves."""

    FAULT_STEP = 100
    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.steps = 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.steps += 1
        if self.steps == self.FAULT_STEP and self._claim_fault():
            self.misbehave()
        return np.zeros(4, np.float32), 1.0, self.steps % 50 == 0, False, {}

    @staticmethod
    def _claim_fault() -> bool:
        marker = os.environ.get("SF_TEST_FAULT_MARKER")
        if marker is None:
            return True
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False


class RaiseOnceEnv(_FaultOnce):
    def misbehave(self):
        raise RuntimeError("simulated env failure on step 100")


class HangOnceEnv(_FaultOnce):
    FAULT_STEP = 50

    def misbehave(self):
        while True:
            time.sleep(1.0)


class MaskedChoiceEnv(gym.Env):
    """Discrete(5) actions of which a random 1-4 are legal each step (obs['action_mask'], int8 as in
    PettingZoo); obs['obs'] shows one legal target action, one-hot; reward 1 for taking it. Illegal
    actions are counted and reported at the episode's end (info['episode_extra_stats']['illegal']).
    10-step episodes."""

    def __init__(self, render_mode=None):
        self.observation_space = spaces.Dict(
            {"obs": spaces.Box(0.0, 1.0, (5,), np.float32), "action_mask": spaces.Box(0, 1, (5,), np.int8)}
        )
        self.action_space = spaces.Discrete(5)
        self.rng = np.random.default_rng(0)
        self.step_count, self.illegal, self.mask, self.target = 0, 0, None, 0

    def _obs(self):
        legal = self.rng.permutation(5)[: self.rng.integers(1, 5)]
        self.mask = np.zeros(5, np.int8)
        self.mask[legal] = 1
        self.target = int(self.rng.choice(legal))
        return {"obs": np.eye(5, dtype=np.float32)[self.target], "action_mask": self.mask.copy()}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.step_count, self.illegal = 0, 0
        return self._obs(), {}

    def step(self, action):
        self.step_count += 1
        self.illegal += int(self.mask[int(action)] == 0)
        reward = float(int(action) == self.target)
        done = self.step_count >= 10
        info = {"episode_extra_stats": {"illegal": float(self.illegal)}} if done else {}
        return self._obs(), reward, done, False, info


class BadMaskEnv(MaskedChoiceEnv):
    """An action mask of the wrong size for its Discrete(5) actions."""

    def __init__(self, render_mode=None):
        super().__init__(render_mode)
        self.observation_space = spaces.Dict(
            {"obs": spaces.Box(0.0, 1.0, (5,), np.float32), "action_mask": spaces.Box(0, 1, (4,), np.int8)}
        )

    def _obs(self):
        return {**super()._obs(), "action_mask": np.ones(4, np.int8)}


class InfoMaskChoiceEnv(MaskedChoiceEnv):
    """MaskedChoiceEnv giving its mask in info['action_mask'] (reset's and step's), its observation the
    plain one-hot Box."""

    def __init__(self, render_mode=None):
        super().__init__(render_mode)
        self.observation_space = spaces.Box(0.0, 1.0, (5,), np.float32)

    def reset(self, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        return obs["obs"], {"action_mask": obs["action_mask"]}

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs["obs"], reward, terminated, truncated, {**info, "action_mask": obs["action_mask"]}


class BadInfoMaskEnv(InfoMaskChoiceEnv):
    def reset(self, seed=None, options=None):
        obs, _ = super().reset(seed=seed)
        return obs, {"action_mask": np.ones(3, np.int8)}


class ObjectiveChoiceEnv(MaskedChoiceEnv):
    """MaskedChoiceEnv whose episodes also report a true_objective: 10 x the return."""

    def step(self, action):
        obs, reward, done, truncated, info = super().step(action)
        self.correct = getattr(self, "correct", 0) * (self.step_count > 1) + reward
        if done:
            info["episode_extra_stats"]["true_objective"] = 10.0 * self.correct
        return obs, reward, done, truncated, info


class NaNAfterEnv(gym.Env):
    """A CartPole-sized env (4 floats, 2 actions, reward 1, 50-step episodes) whose observations turn NaN
    after NAN_AFTER steps of each env and stay so (a simulator that blew up)."""

    NAN_AFTER = 200
    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.steps, self.episode_steps = 0, 0

    def _obs(self):
        return np.full(4, np.nan if self.steps >= self.NAN_AFTER else 0.5 * (self.episode_steps % 2), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.episode_steps = 0
        return self._obs(), {}

    def step(self, action):
        self.steps += 1
        self.episode_steps += 1
        return self._obs(), self._reward(), self.episode_steps >= 50, False, {}

    def _reward(self) -> float:
        return 1.0


class InfRewardAfterEnv(NaNAfterEnv):
    """NaNAfterEnv whose observations stay finite and whose rewards turn +inf instead."""

    def _obs(self):
        return np.full(4, 0.5 * (self.episode_steps % 2), np.float32)

    def _reward(self) -> float:
        return np.inf if self.steps >= self.NAN_AFTER else 1.0


class UnboundedActionEnv(gym.Env):
    """Two unbounded float actions (a Box from -inf to inf), 3 float observations, 20-step episodes."""

    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.steps += 1
        return np.zeros(3, np.float32), -float(np.square(action).sum()), self.steps >= 20, False, {}


class RecallEnv(gym.Env):
    """A memory task: the first observation shows a cue (+1 or -1), the next DELAY ones show 0, then the agent is
    rewarded 1 for the action that matches the cue (0 for -1, 1 for +1) and the episode ends; every other step's
    reward is 0 whatever the action. Without memory the last action is a coin flip (mean return 0.5)."""

    DELAY = 2
    observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.steps, self.cue = 0, int(self.np_random.integers(0, 2))
        return np.array([2.0 * self.cue - 1.0], np.float32), {}

    def step(self, action):
        self.steps += 1
        if self.steps <= self.DELAY:
            return np.zeros(1, np.float32), 0.0, False, False, {}
        return np.zeros(1, np.float32), float(int(action) == self.cue), True, False, {}


class CopyBitsEnv(gym.Env):
    """MultiBinary actions: the observation shows BITS random bits, the reward is the fraction of them the action
    copies; 8-step episodes, so the optimum return is 8 (a random policy's is 4)."""

    BITS, LENGTH = 6, 8
    observation_space = spaces.Box(0.0, 1.0, (BITS,), np.float32)
    action_space = spaces.MultiBinary(BITS)

    def _obs(self):
        self.bits = self.np_random.integers(0, 2, self.BITS)
        return self.bits.astype(np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self._obs(), {}

    def step(self, action):
        assert self.action_space.contains(np.asarray(action)), action
        self.steps += 1
        reward = float(np.mean(np.asarray(action) == self.bits))
        return self._obs(), reward, self.steps >= self.LENGTH, False, {}


class PickAndPlaceEnv(gym.Env):
    """Tuple actions (Discrete(3), Box(-1, 1, (1,))): the observation shows a target class (one-hot of 3) and a
    target point in [-1, 1]; the reward is 1 for the right class plus 1 - |distance to the point| (at least 0);
    8-step episodes, so the optimum return is 16 (a random policy's is about 8 x (1/3 + 0.5))."""

    LENGTH = 8
    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Tuple((spaces.Discrete(3), spaces.Box(-1.0, 1.0, (1,), np.float32)))

    def _obs(self):
        self.target, self.point = int(self.np_random.integers(0, 3)), float(self.np_random.uniform(-1, 1))
        return np.array([*np.eye(3)[self.target], self.point], np.float32)

    def _reward(self, which: int, where: float) -> float:
        return float(which == self.target) + max(0.0, 1.0 - abs(where - self.point))

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self._obs(), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.steps += 1
        reward = self._reward(int(action[0]), float(action[1][0]))
        return self._obs(), reward, self.steps >= self.LENGTH, False, {}


class PickAndPlaceDictEnv(PickAndPlaceEnv):
    """PickAndPlaceEnv with a Dict action: the class from Discrete(3, start=1), the point, and two bits that
    earn nothing."""

    action_space = spaces.Dict(
        {
            "which": spaces.Discrete(3, start=1),
            "where": spaces.Box(-1.0, 1.0, (1,), np.float32),
            "lights": spaces.MultiBinary(2),
        }
    )

    def step(self, action):
        assert self.action_space.contains(action), action
        self.steps += 1
        reward = self._reward(int(action["which"]) - 1, float(action["where"][0]))
        return self._obs(), reward, self.steps >= self.LENGTH, False, {}


class MissionEnv(gym.Env):
    """A MiniGrid-like Dict observation: an image, a Discrete direction, a Text mission and a nested Dict of a
    MultiDiscrete and a Box. MultiDiscrete([2, 2]) actions: 1 for the first matching the direction's parity, 1 for
    the second matching the mission ('go left' 0, 'go right' 1); 4-step episodes, so the optimum return is 8, and
    6 for a policy that cannot read the mission."""

    LENGTH = 4
    observation_space = spaces.Dict(
        {
            "image": spaces.Box(0, 255, (5, 5, 3), np.uint8),
            "direction": spaces.Discrete(4),
            "mission": spaces.Text(12, charset="abcdefghijklmnopqrstuvwxyz "),
            "status": spaces.Dict(
                {"keys": spaces.MultiDiscrete([2, 3]), "level": spaces.Box(0.0, 1.0, (2,), np.float32)}
            ),
        }
    )
    action_space = spaces.MultiDiscrete([2, 2])

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def _obs(self):
        self.direction, self.right = int(self.np_random.integers(0, 4)), bool(self.np_random.integers(0, 2))
        return {
            "image": np.full((5, 5, 3), 7 * self.steps, np.uint8),
            "direction": self.direction,
            "mission": "go right" if self.right else "go left",
            "status": {"keys": np.array([1, 2]), "level": np.array([0.5, 0.25], np.float32)},
        }

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self._obs(), {}

    def step(self, action):
        self.steps += 1
        reward = float(action[0] == self.direction % 2) + float(action[1] == int(self.right))
        return self._obs(), reward, self.steps >= self.LENGTH, False, {}


class TargetDictEnv(gym.Env):
    """A Dict observation of a Discrete target, a text and a nested Dict of a MultiDiscrete and a Box; one Box
    action, rewarded for nearing the target's value (0, 1 or 2 mapped to -1, 0 and 1); 8-step episodes."""

    observation_space = spaces.Dict(
        {
            "target": spaces.Discrete(3),
            "note": spaces.Text(8, charset="abc "),
            "status": spaces.Dict({"dials": spaces.MultiDiscrete([2, 3]), "x": spaces.Box(-1.0, 1.0, (1,))}),
        }
    )
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def _obs(self):
        self.target = int(self.np_random.integers(0, 3))
        status = {"dials": np.array([1, self.target]), "x": np.zeros(1, np.float32)}
        return {"target": self.target, "note": "ab c"[: self.target + 1], "status": status}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self._obs(), {}

    def step(self, action):
        self.steps += 1
        reward = self._reward(action)  # of the target the action saw
        return self._obs(), reward, self.steps >= 8, False, {}

    def _reward(self, action) -> float:
        return -abs(float(np.asarray(action).reshape(-1)[0]) - (self.target - 1))


class TargetChoiceEnv(TargetDictEnv):
    """TargetDictEnv's observations with Discrete(3) actions: 1 for choosing the target."""

    action_space = spaces.Discrete(3)

    def _reward(self, action) -> float:
        return float(int(action) == self.target)
