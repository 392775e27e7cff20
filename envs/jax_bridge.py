"""JAX envs as device envs (envs.device's contract), through DLPack: a functional JAX env in gymnax's API (gymnax
>= 1.0: `reset(key, params) -> (obs, state)`, `step(key, state, action, params) -> (obs, state, reward, terminated,
truncated, info)` resetting on the ending step, the last observation in info['final_observation']) is vmapped over
the batch and jitted on the JAX device of the torch device asked for; its arrays become torch tensors without a copy
and the actions go back the same way. Needs jax (pip install 'sf_engine[jax]').

  --env gymnax/CartPole-v1          any gymnax id (pip install gymnax): GymnaxVectorEnv
  --env my_module:MyJaxEnv          a JaxVectorEnv subclass that passes its own env (and params) to __init__
"""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

GYMNAX_PREFIX = "gymnax/"


def _space(space) -> spaces.Space:
    """A gymnax (or gymnasium) space of one env as Gymnasium's: a Discrete, or a Box."""
    if hasattr(space, "n"):
        return spaces.Discrete(int(space.n))
    shape = tuple(int(d) for d in space.shape)
    low = np.broadcast_to(np.asarray(space.low, np.float32), shape)
    high = np.broadcast_to(np.asarray(space.high, np.float32), shape)
    return spaces.Box(low, high, shape, np.float32)


class JaxVectorEnv(gymnasium.vector.VectorEnv):
    """`num_envs` copies of the functional JAX env `env` (with `params`, its default_params where None) on the JAX
    device of the torch `device`, as a device env that resets on the ending step (SAME_STEP)."""

    def __init__(self, env, params=None, num_envs: int = 1, device="cpu"):
        import jax
        import torch

        self.env, self.params = env, env.default_params if params is None else params
        self.num_envs, self.device = int(num_envs), torch.device(device)
        platform = "gpu" if self.device.type == "cuda" else "cpu"
        self.jax_device = jax.devices(platform)[self.device.index or 0]
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
        self.single_observation_space = _space(env.observation_space(self.params))
        self.single_action_space = _space(env.action_space(self.params))
        self.observation_space = gymnasium.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gymnasium.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self._discrete = isinstance(self.single_action_space, spaces.Discrete)
        # jitted without a device: each call runs where its inputs are, the keys on jax_device (and the actions there)
        self._reset_batch = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
        self._step_batch = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))
        self.key = jax.device_put(jax.random.key(0), self.jax_device)
        self.state = None

    def _keys(self):
        import jax

        self.key, batch = jax.random.split(self.key)
        return jax.random.split(batch, self.num_envs)

    @staticmethod
    def _torch(array, dtype=None):
        """A JAX array as a torch tensor on the same memory (DLPack); `dtype`: converted on the torch side."""
        import torch

        tensor = torch.from_dlpack(array)
        return tensor if dtype is None else tensor.to(dtype)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        import jax

        if seed is not None:
            self.key = jax.device_put(jax.random.key(int(seed)), self.jax_device)
        obs, self.state = self._reset_batch(self._keys(), self.params)
        return self._torch(obs), {}

    def step(self, actions):
        import jax.numpy as jnp
        import torch

        # int32 or float32 on the torch side (JAX without x64 takes no int64), then handed over without a copy
        actions = actions.to(torch.int32 if self._discrete else torch.float32).contiguous()
        obs, self.state, rewards, terminated, truncated, info = self._step_batch(
            self._keys(), self.state, jnp.from_dlpack(actions), self.params
        )
        final_obs = self._torch(info["final_observation"])
        return (
            self._torch(obs),
            self._torch(rewards, torch.float32),
            self._torch(terminated, torch.bool),
            self._torch(truncated, torch.bool),
            {"final_obs": final_obs},
        )

    def close(self, **kwargs) -> None:
        self.state = None


class GymnaxVectorEnv(JaxVectorEnv):
    """A gymnax env by its id (`gymnax.make`), as a device env."""

    def __init__(self, name: str, num_envs: int = 1, device="cpu"):
        import gymnax

        env, params = gymnax.make(name)
        super().__init__(env, params, num_envs, device)


def gymnax_class(env_id: str):
    """`--env gymnax/NAME`'s maker (built as maker(num_envs=N, device=D))."""
    import functools

    return functools.partial(GymnaxVectorEnv, env_id.removeprefix(GYMNAX_PREFIX))
