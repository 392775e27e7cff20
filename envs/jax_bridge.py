"""JAX envs as device envs (envs.device's contract), through DLPack: a JAX env is vmapped over the batch and jitted on
the JAX device of the torch device asked for; its arrays become torch tensors without a copy and the actions go back
the same way. Two APIs of functional JAX envs, both resetting on the ending step (SAME_STEP), the ended episode's last
observation in info["final_obs"]. Needs jax (pip install 'sf_engine[jax]').

  gymnax's (gymnax >= 1.0: `reset(key, params) -> (obs, state)`, `step(key, state, action, params) -> (obs, state,
  reward, terminated, truncated, info)` resetting on the ending step, the last observation in
  info['final_observation']): JaxVectorEnv
    --env gymnax/CartPole-v1          any gymnax id (pip install gymnax)
  Brax's, which MuJoCo Playground shares (`reset(rng) -> State`, `step(state, action) -> State`, State a dataclass
  with obs, reward, done, metrics and info; `observation_size`, `action_size`, actions in [-1, 1]; no resets of its
  own): BraxVectorEnv, which ends an episode at a termination (done) or after `episode_length` steps (a truncation)
  and then puts that env back in the first state its reset drew, as Brax's and Playground's training wrappers do
    --env brax/ant                    any Brax env (pip install brax), episodes of 1,000 steps as Brax trains them
    --env playground/CartpoleBalance  any MuJoCo Playground env (pip install playground), its config's episodes
  --env my_module:MyJaxEnv            a JaxVectorEnv or BraxVectorEnv subclass that passes its own env to __init__
"""

from __future__ import annotations

import dataclasses
import functools
import os

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from .spec import EnvError

# JAX takes 75% of a GPU's memory when it starts, unless told not to: the torch half of the process (the acting
# network) and the learner's process need theirs. Set before jax is imported (here, in the function that first needs it)
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# --env prefix -> (the package its ids need, what installs it)
JAX_ENV_PREFIXES = {
    "gymnax/": ("gymnax", "gymnax"),
    "brax/": ("brax", "brax"),
    "playground/": ("mujoco_playground", "playground"),
}
BRAX_EPISODE_LENGTH = 1000  # brax.training's default
BRAX_KEPT = ("reward", "done", "metrics", "info")  # a Brax State's fields an env put back in its first state keeps


def _space(space) -> spaces.Space:
    """A gymnax (or gymnasium) space of one env as Gymnasium's: a Discrete, or a Box."""
    if hasattr(space, "n"):
        return spaces.Discrete(int(space.n))
    shape = tuple(int(d) for d in space.shape)
    low = np.broadcast_to(np.asarray(space.low, np.float32), shape)
    high = np.broadcast_to(np.asarray(space.high, np.float32), shape)
    return spaces.Box(low, high, shape, np.float32)


class _JaxBatch(gymnasium.vector.VectorEnv):
    """What both APIs share: `num_envs` envs on the JAX device of the torch `device`, the spaces of one env, the
    random keys, and the arrays handed over as tensors."""

    def __init__(self, observation_space, action_space, num_envs: int, device):
        import jax
        import torch

        self.num_envs, self.device = int(num_envs), torch.device(device)
        platform = "gpu" if self.device.type == "cuda" else "cpu"
        self.jax_device = jax.devices(platform)[self.device.index or 0]
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
        self.single_observation_space, self.single_action_space = observation_space, action_space
        self.observation_space = gymnasium.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gymnasium.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self._discrete = isinstance(self.single_action_space, spaces.Discrete)
        self.key = jax.device_put(jax.random.key(0), self.jax_device)
        self.state = None

    def _seed(self, seed: int | None) -> None:
        import jax

        if seed is not None:
            self.key = jax.device_put(jax.random.key(int(seed)), self.jax_device)

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

    def _jax_actions(self, actions):
        """`actions` as a JAX array on the same memory: int32 or float32 (JAX without x64 takes no int64)."""
        import jax.numpy as jnp
        import torch

        return jnp.from_dlpack(actions.to(torch.int32 if self._discrete else torch.float32).contiguous())

    def _returned(self, obs, rewards, terminated, truncated, final_obs) -> tuple:
        import torch

        return (
            self._torch(obs),
            self._torch(rewards, torch.float32),
            self._torch(terminated, torch.bool),
            self._torch(truncated, torch.bool),
            {"final_obs": self._torch(final_obs)},
        )

    def close(self, **kwargs) -> None:
        self.state = None


class JaxVectorEnv(_JaxBatch):
    """`num_envs` copies of the functional JAX env `env` in gymnax's API (with `params`, its default_params where
    None) on the JAX device of the torch `device`, as a device env."""

    def __init__(self, env, params=None, num_envs: int = 1, device="cpu"):
        import jax

        self.env, self.params = env, env.default_params if params is None else params
        observation_space, action_space = env.observation_space(self.params), env.action_space(self.params)
        super().__init__(_space(observation_space), _space(action_space), num_envs, device)
        # jitted without a device: each call runs where its inputs are, the keys on jax_device (and the actions there)
        self._reset_batch = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
        self._step_batch = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self._seed(seed)
        obs, self.state = self._reset_batch(self._keys(), self.params)
        return self._torch(obs), {}

    def step(self, actions):
        obs, self.state, rewards, terminated, truncated, info = self._step_batch(
            self._keys(), self.state, self._jax_actions(actions), self.params
        )
        return self._returned(obs, rewards, terminated, truncated, info["final_observation"])


class GymnaxVectorEnv(JaxVectorEnv):
    """A gymnax env by its id (`gymnax.make`), as a device env."""

    def __init__(self, name: str, num_envs: int = 1, device="cpu"):
        import gymnax

        env, params = gymnax.make(name)
        super().__init__(env, params, num_envs, device)


class BraxVectorEnv(_JaxBatch):
    """`num_envs` copies of the JAX env `env` in Brax's API on the JAX device of the torch `device`, as a device env
    whose episodes end at a termination or after `episode_length` steps. An env whose episode ended goes back to the
    first state its last reset drew (its physics state and observation; its info and metrics carry on): Brax's and
    MuJoCo Playground's own training wrappers restart episodes so, one reset per env, not one per episode."""

    def __init__(self, env, episode_length: int = BRAX_EPISODE_LENGTH, num_envs: int = 1, device="cpu"):
        import jax

        if not isinstance(env.observation_size, int):
            raise EnvError(f"{type(env).__name__}: observations of several arrays ({env.observation_size}) are not run")
        observation_space = spaces.Box(-np.inf, np.inf, (env.observation_size,), np.float32)
        super().__init__(observation_space, spaces.Box(-1.0, 1.0, (env.action_size,), np.float32), num_envs, device)
        self.env, self.episode_length = env, int(episode_length)
        self._reset_batch = jax.jit(jax.vmap(env.reset))
        self._step_batch = jax.jit(self._batch_step)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        import jax.numpy as jnp

        self._seed(seed)
        first = self._reset_batch(self._keys())
        self.state = (first, jnp.zeros(self.num_envs, jnp.int32), first)
        return self._torch(first.obs), {}

    def step(self, actions):
        self.state, returned = self._step_batch(self.state, self._jax_actions(actions))
        return self._returned(*returned)

    def _batch_step(self, carry, actions):
        """One step of the batch (jitted): (state, steps taken in the episode, first state) and the actions to the
        next carry and (obs, rewards, terminated, truncated, final_obs)."""
        import jax
        import jax.numpy as jnp

        state, steps, first = carry
        state = jax.vmap(self.env.step)(state, actions)
        steps = steps + 1
        terminated = state.done > 0
        truncated = (steps >= self.episode_length) & ~terminated
        done = terminated | truncated

        def back(start, now):  # an ended env's rows from its first state (a leaf not per env, as it is)
            if now.ndim == 0 or now.shape[0] != len(done):
                return now
            return jnp.where(done.reshape(done.shape + (1,) * (now.ndim - 1)), start, now)

        restarted = {
            field.name: jax.tree.map(back, getattr(first, field.name), getattr(state, field.name))
            for field in dataclasses.fields(state)
            if field.name not in BRAX_KEPT
        }
        final_obs, rewards = state.obs, state.reward
        state = dataclasses.replace(state, **restarted, done=jnp.zeros_like(state.done))
        return (state, jnp.where(done, 0, steps), first), (state.obs, rewards, terminated, truncated, final_obs)


def _brax_env(name: str, device) -> tuple:
    """(the Brax env `name`, its episode length)."""
    from brax import envs

    return envs.get_environment(name), BRAX_EPISODE_LENGTH


def _playground_env(name: str, device) -> tuple:
    """(the MuJoCo Playground env `name`, its config's episode length): on a GPU in its config's implementation
    (Warp's, where warp is installed), else in MJX's JAX one (Warp's is for GPUs)."""
    import importlib.util

    from mujoco_playground import registry

    config = registry.get_default_config(name)
    on_gpu = not str(device).startswith("cpu") and importlib.util.find_spec("warp") is not None
    overrides = {} if on_gpu else {"impl": "jax"}
    return registry.load(name, config, overrides), config.episode_length


def _made_by_name(maker, name: str, num_envs: int = 1, device="cpu"):
    env, episode_length = maker(name, device)
    return BraxVectorEnv(env, episode_length, num_envs, device)


def jax_env_prefix(env_id: str) -> str | None:
    """The JAX_ENV_PREFIXES entry `env_id` starts with, or None."""
    return next((prefix for prefix in JAX_ENV_PREFIXES if env_id.startswith(prefix)), None)


def jax_env_class(env_id: str):
    """`--env gymnax/NAME`'s, `brax/NAME`'s or `playground/NAME`'s maker (built as maker(num_envs=N, device=D))."""
    prefix = jax_env_prefix(env_id)
    name = env_id.removeprefix(prefix)
    if prefix == "gymnax/":
        return functools.partial(GymnaxVectorEnv, name)
    return functools.partial(_made_by_name, _brax_env if prefix == "brax/" else _playground_env, name)
