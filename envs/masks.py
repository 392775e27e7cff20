"""Action masks: which actions are legal, as an observation entry ACTION_MASK_KEY (one 0/1 per action,
PettingZoo's layout; for MultiDiscrete the sub-spaces' masks one after the other). An env that gives
its mask in its info instead (`info["action_mask"]` from reset and step) gets it moved into its
observation by InfoActionMask, so that it travels through the shared buffers like any entry; a step
whose info has no mask leaves every action legal (logged once per env). The model masks its logits
(model.ActorCritic.legal).
"""

from __future__ import annotations

import functools
import logging

import numpy as np

from .spec import ACTION_MASK_KEY, EnvSpec


def random_actions(spec: EnvSpec, obs: dict, rng: np.random.Generator, rows=None) -> np.ndarray:
    """Uniformly random actions of `rows` (all rows when None; the policy's values, 0..n-1), legal ones
    where the observation has an action mask (a row with no legal action: any)."""
    count = len(next(iter(obs.values()))) if rows is None else len(rows)
    return _random(spec.action, count, rng, obs if spec.action_mask else None, rows)


def _random(action, count: int, rng: np.random.Generator, obs, rows) -> np.ndarray:
    """`count` random actions of the ActionSpec `action`, legal ones by obs[ACTION_MASK_KEY] where `obs` is given."""
    if action.kind == "composite":  # each part's columns side by side, as float32
        parts = [_random(part, count, rng, None, rows) for part in action.parts]
        return np.concatenate([p.reshape(count, -1).astype(np.float32) for p in parts], axis=1)
    if action.kind == "continuous":
        return rng.uniform(action.low, action.high, (count, *action.shape)).astype(np.float32)
    if action.kind == "multi_binary":
        return rng.integers(0, 2, (count, *action.shape))
    if obs is not None and action.kind == "discrete":
        mask = np.asarray(obs[ACTION_MASK_KEY])
        legal = (mask if rows is None else mask[rows]) > 0
        legal[~legal.any(1)] = True
        return np.argmax(legal * rng.uniform(0.5, 1.0, legal.shape), 1)
    picks = rng.integers(0, action.nvec, (count, len(action.nvec)))
    return picks[:, 0] if action.kind == "discrete" else picks


def check_action_mask(env_id: str, spec: EnvSpec, error) -> None:
    """An ACTION_MASK_KEY entry must hold one value per action of a discrete action space, beside
    something for the policy to see; else `error` with one line."""
    if not spec.action_mask:
        return
    shape = next(shape for key, shape, _ in spec.obs if key == ACTION_MASK_KEY)
    maskable = spec.action.kind in ("discrete", "multi_discrete")
    if not maskable or shape != (sum(spec.action.nvec),):
        size = f"({sum(spec.action.nvec)},)" if maskable else f"no mask ({spec.action.kind} actions)"
        raise error(
            f"--env {env_id}: observation {ACTION_MASK_KEY!r} has shape {shape}; the action space "
            f"{spec.action.kind} {spec.action.nvec or spec.action.shape} takes {size}: one 0/1 per action"
        )
    if len(spec.obs) == 1:
        raise error(
            f"--env {env_id}: the observation holds only {ACTION_MASK_KEY!r}; the policy needs an "
            f"entry to see besides the mask"
        )


def mask_in_info(env_id: str, observation_space, info: dict, size: int, error) -> bool:
    """Whether an env gives its mask in its info (of reset) rather than in its observation; a mask
    there of the wrong size is `error` with one line."""
    from gymnasium import spaces

    in_obs = isinstance(observation_space, spaces.Dict) and ACTION_MASK_KEY in observation_space.spaces
    if ACTION_MASK_KEY not in info or in_obs:
        return False
    if np.asarray(info[ACTION_MASK_KEY]).size != size:
        raise error(
            f"--env {env_id}: info[{ACTION_MASK_KEY!r}] holds {np.asarray(info[ACTION_MASK_KEY]).size} "
            f"values; the action space takes {size}: one 0/1 per action"
        )
    return True


def with_mask_space(observation_space, size: int):
    """The observation space with the mask entry added (a plain Box becomes the entry 'obs')."""
    from gymnasium import spaces

    inner = observation_space
    entries = dict(inner.spaces) if isinstance(inner, spaces.Dict) else {"obs": inner}
    return spaces.Dict({**entries, ACTION_MASK_KEY: spaces.Box(0, 1, (size,), np.int8)})


@functools.cache
def _wrapper_class():  # made on first use: gymnasium is imported only where envs are made
    import gymnasium as gym

    class InfoActionMask(gym.Wrapper):
        """The env's info['action_mask'] as an observation entry (see with_mask_space)."""

        def __init__(self, env, size: int):
            super().__init__(env)
            self.observation_space = with_mask_space(env.observation_space, size)
            self.size, self.warned = size, False

        def _with_mask(self, obs, info: dict) -> dict:
            entries = dict(obs) if isinstance(obs, dict) else {"obs": obs}
            mask = info.get(ACTION_MASK_KEY)
            if mask is None and not self.warned:
                logging.warning("an info without %r: every action is legal in that step", ACTION_MASK_KEY)
                self.warned = True
            entries[ACTION_MASK_KEY] = (
                np.ones(self.size, np.int8) if mask is None else np.asarray(mask, np.int8).reshape(self.size)
            )
            return entries

        def reset(self, **kwargs):
            obs, info = self.env.reset(**kwargs)
            return self._with_mask(obs, info), info

        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            return self._with_mask(obs, info), reward, terminated, truncated, info

    return InfoActionMask


class MaskFromInfo:
    """An env factory whose envs carry their info's action mask in their observation."""

    def __init__(self, factory, size: int):
        self.factory, self.size = factory, size

    def __call__(self, render_mode=None):
        env = self.factory(render_mode=render_mode) if render_mode else self.factory()
        return _wrapper_class()(env, self.size)
