"""Env registry and the batched-env interface (runs in rollout workers; probing runs in the runner).

A `BatchEnv` steps `num_envs` envs at once and follows the Gymnasium 1.x / EnvPool convention: an env
that ends (terminated or truncated) is reset on the *next* step, whose action is ignored and which
returns the first observation of the new episode with reward 0. The worker marks that step invalid.
"""
from __future__ import annotations

import warnings
from typing import Callable

import numpy as np

from sf_engine.shared_buffers import EnvSpec

_REGISTRY: dict[str, Callable] = {}


class EnvError(ValueError):
    """An env that cannot be made or used: the message names the env and what is wrong."""


def register_env(name: str, make_env: Callable) -> None:
    """Register `make_env()` -> gymnasium.Env under `name` (usable as --env name)."""
    _REGISTRY[name] = make_env


class BatchEnv:
    """`num_envs` envs stepped as one batch. Shapes: obs [E, *obs_shape], rewards/terminated/truncated [E]."""

    def __init__(self, env, num_envs: int):
        self._env, self.num_envs = env, num_envs

    def reset(self) -> np.ndarray:
        obs, _ = self._env.reset()
        return obs

    def step(self, actions: np.ndarray):
        obs, rewards, terminated, truncated, _ = self._env.step(actions)
        return obs, rewards, terminated, truncated

    def close(self) -> None:
        self._env.close()


def _envpool_ids() -> set:
    import envpool

    return set(envpool.list_all_envs())


def resolve_backend(env_id: str, backend: str) -> str:
    if backend != "auto":
        return backend
    if env_id in _REGISTRY:
        return "gymnasium"
    return "envpool" if env_id in _envpool_ids() else "gymnasium"


def make_batch_env(env_id: str, backend: str, num_envs: int, seed: int) -> BatchEnv:
    """Make `num_envs` envs of `env_id` on one CPU thread (a worker owns one core)."""
    backend = resolve_backend(env_id, backend)
    if backend == "envpool":
        import envpool

        with warnings.catch_warnings():  # EnvPool's float64 Box bounds make Gymnasium warn on every make
            warnings.simplefilter("ignore")
            env = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, num_threads=1, seed=seed)
            env.observation_space  # built (and cached) on first use
    else:
        import gymnasium as gym

        if env_id in _REGISTRY:
            factory = _REGISTRY[env_id]
            env = gym.vector.SyncVectorEnv([factory] * num_envs, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
        else:
            env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")
        env.reset(seed=seed)
    return BatchEnv(env, num_envs)


def _spaces(env_id: str, backend: str):
    if backend == "envpool":
        import envpool

        if env_id not in _envpool_ids():
            raise EnvError(f"--env {env_id}: EnvPool has no such id (use --env_backend gymnasium for Gymnasium ids)")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            spec = envpool.make_spec(env_id)
            return spec.observation_space, spec.action_space
    import gymnasium as gym

    if env_id in _REGISTRY:
        env = _REGISTRY[env_id]()
    else:
        try:
            env = gym.make(env_id)
        except gym.error.Error as exc:
            raise EnvError(f"--env {env_id}: unknown environment id ({exc.__class__.__name__}); "
                           f"check the spelling or import the package that registers it") from None
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def probe_env_spec(env_id: str, backend: str) -> EnvSpec:
    """Observation shape/dtype and action count, checked against what the engine handles."""
    from gymnasium import spaces

    backend = resolve_backend(env_id, backend)
    obs_space, action_space = _spaces(env_id, backend)
    if not isinstance(obs_space, spaces.Box):
        raise EnvError(f"--env {env_id}: observation space {obs_space} is not supported (a Box is needed)")
    if not isinstance(action_space, spaces.Discrete):
        raise EnvError(f"--env {env_id}: action space {action_space} is not supported (Discrete is needed)")
    return EnvSpec(obs_shape=tuple(obs_space.shape), obs_dtype=np.dtype(obs_space.dtype).name,
                   num_actions=int(action_space.n))
