"""Gymnasium's own Atari ids (`--env ale_py:ALE/Breakout-v5`, as ale-py registers them) in the Atari family, made
as EnvPool makes its Atari envs (registry's atari family): 84x84 grayscale frames (the max of the last two, resized
by area), a frameskip of 4 with no sticky actions, up to 30 no-op starts, FIRE pressed at each start where the game
has it, 4 frames stacked, at most 27,000 steps (108,000 frames); for training also episodic life (a life lost ends
the episode the learner sees, not the game) and rewards clipped to their sign, while `info['reward']` and
`info['terminated']` carry the true score and the true game over, which the reported returns add up as they do on
EnvPool. Each env is one ALE instance stepped in the rollout worker's thread.
"""

from __future__ import annotations

import functools

import numpy as np

FRAME_SKIP = 4
NOOP_MAX = 30
STACK = 4
SCREEN = 84
REPEAT_ACTION_PROBABILITY = 0.0  # EnvPool's default (Gymnasium's v5 ids: 0.25)
MAX_EPISODE_STEPS = 27_000
FIRE = "FIRE"
ALE_PREFIX = "ALE/"


def gym_atari_id(env_id: str) -> str | None:
    """The Gymnasium ALE id of `env_id` ('ale_py:ALE/Breakout-v5' or 'ALE/Breakout-v5'), or None."""
    name = env_id.partition(":")[2] if env_id.startswith("ale_py:") else env_id
    return name if name.startswith(ALE_PREFIX) else None


def envpool_twin(env_id: str) -> str | None:
    """EnvPool's id of the same game ('Breakout-v5'), where EnvPool is installed and has it; else None."""
    import importlib.util

    name = gym_atari_id(env_id)
    if name is None or importlib.util.find_spec("envpool") is None:
        return None
    import envpool

    twin = name.removeprefix(ALE_PREFIX)
    return twin if twin in envpool.list_all_envs() else None


def settings_line(env_id: str) -> str:
    """The one line that says how the env is made (and where EnvPool has the same game)."""
    twin = envpool_twin(env_id)
    faster = f"; EnvPool has the same game, preprocessed in C++ and faster: --env {twin}" if twin else ""
    return (
        f"--env {env_id}: the Atari family's preprocessing: {SCREEN}x{SCREEN} gray, frameskip {FRAME_SKIP}, "
        f"sticky actions {REPEAT_ACTION_PROBABILITY:g}, up to {NOOP_MAX} no-ops and FIRE at the start, {STACK} frames "
        f"stacked; episodic life and clipped rewards while training{faster}"
    )


class AtariFactory:
    """Picklable factory of one preprocessed env of the Gymnasium ALE id `name` (`training`: episodic life and
    clipped rewards)."""

    def __init__(self, name: str, training: bool):
        self.name, self.training = name, training

    def __call__(self, render_mode=None):
        import ale_py
        import gymnasium as gym
        from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

        gym.register_envs(ale_py)
        env = gym.make(
            self.name,
            frameskip=1,
            repeat_action_probability=REPEAT_ACTION_PROBABILITY,
            full_action_space=False,
            max_num_frames_per_episode=MAX_EPISODE_STEPS * FRAME_SKIP,
            render_mode=render_mode,
        )
        env = AtariPreprocessing(env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN)
        return FrameStackObservation(_score_wrapper()(env, self.training), STACK)


@functools.cache
def _score_wrapper():
    import gymnasium as gym

    class TrueScore(gym.Wrapper):
        """FIRE at each start; with `training`, a lost life ends the episode the learner sees (the next reset goes
        on with the same game) and rewards are clipped to their sign; info['reward'] and info['terminated'] are the
        true score and game over (EnvPool's keys)."""

        def __init__(self, env, training: bool):
            super().__init__(env)
            self.training, self.game_over = training, True
            meanings = env.unwrapped.get_action_meanings()
            self.fire = meanings.index(FIRE) if FIRE in meanings else None

        def _lives(self) -> int:
            return self.env.unwrapped.ale.lives()

        def reset(self, *, seed=None, options=None):
            if self.game_over or seed is not None:
                obs, info = self.env.reset(seed=seed, options=options)
            else:  # a life was lost: the same game goes on
                obs, _, terminated, truncated, info = self.env.step(0)
                if terminated or truncated:
                    obs, info = self.env.reset(options=options)
            if self.fire is not None:
                obs, _, terminated, truncated, info = self.env.step(self.fire)
                if terminated or truncated:
                    obs, info = self.env.reset(options=options)
            self.game_over, self.lives = False, self._lives()
            return obs, {**info, "reward": 0.0, "terminated": False}

        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            self.game_over = terminated or truncated
            lives, life_lost = self._lives(), False
            if self.training and 0 < lives < self.lives:
                life_lost = True
            self.lives = lives
            info = {**info, "reward": float(reward), "terminated": bool(terminated)}
            shown = float(np.sign(reward)) if self.training else float(reward)
            return obs, shown, terminated or life_lost, truncated, info

    return TrueScore
