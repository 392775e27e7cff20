"""Device envs: batched envs that live on one torch device, their observations, rewards and ends never on the host.

The contract (what the engine runs in device mode): a `gymnasium.vector.VectorEnv` with
  num_envs                  N, the batch it steps
  device                    the torch.device every tensor in and out lives on
  single_observation_space  a Box (the observation of one env)
  single_action_space       a Discrete or a Box (the action of one env)
  reset(seed=None)          -> (obs [N, *obs_shape], info)
  step(actions)             actions [N] (int64, Discrete) or [N, *action_shape] (float32, Box), on the device
                            -> (obs, reward [N] float32, terminated [N] bool, truncated [N] bool, info)
  metadata["autoreset_mode"]  how an env that ends starts its next episode (Gymnasium 1.x's two modes):
    AutoresetMode.NEXT_STEP   the step after the end resets it: its action is ignored, it returns the new
                              episode's first observation with reward 0 and neither end (EnvPool's convention)
    AutoresetMode.SAME_STEP   the ending step resets it at once and returns the new episode's first observation;
                              info["final_obs"] [N, *obs_shape] holds the ended episode's last observation (its rows
                              of envs that did not end: the returned observation), what a truncated episode
                              bootstraps from (Isaac Lab's and Brax's convention)

A device env is named by `--env` as a shipped id (DEVICE_ENV_IDS: TorchCartPole-v1, ...), as `gymnax/NAME`,
`brax/NAME` or `playground/NAME` (a JAX env through the JAX bridge, envs.jax_bridge) or as `module:Class`, a VectorEnv
subclass built as `Class(num_envs=N, device=D)`. envs/torch_envs.py holds `TorchVectorEnv`, a base for writing one in
torch, and the shipped ones. torch is imported where an env is made, not here: the main process
decides what an id is without it.
"""

from __future__ import annotations

import importlib
import importlib.util

import gymnasium
from gymnasium.vector import AutoresetMode

from .batch import AUTORESET_MODES, StepResult
from .jax_bridge import JAX_ENV_PREFIXES, jax_env_class, jax_env_prefix
from .spec import EnvError
from .user_code import import_user_module, user_attribute

# the shipped device envs: id -> their class in envs/torch_envs.py
DEVICE_ENV_IDS = {
    "TorchCartPole-v1": "TorchCartPole",
    "TorchAcrobot-v1": "TorchAcrobot",
    "TorchPendulum-v1": "TorchPendulum",
}


def device_env_class(env_id: str):
    """The device env class `env_id` names (a shipped id, or `module:Class` naming a VectorEnv subclass), or None
    where it names something else (a Gymnasium env, a factory: made as such elsewhere)."""
    if env_id in DEVICE_ENV_IDS:
        return getattr(importlib.import_module(".torch_envs", __package__), DEVICE_ENV_IDS[env_id])
    prefix = jax_env_prefix(env_id)
    if prefix is not None:  # a JAX env through DLPack (envs.jax_bridge)
        for package, install in (("jax", "'sf_engine[jax]'"), JAX_ENV_PREFIXES[prefix]):
            if importlib.util.find_spec(package) is None:
                raise EnvError(f"--env {env_id}: {package} is not installed here: pip install {install}")
        return jax_env_class(env_id)
    if ":" not in env_id:
        return None
    module = import_user_module(env_id, "--env", EnvError)
    if not hasattr(module, env_id.partition(":")[2]):
        return None  # a Gymnasium id the module registers
    target = user_attribute(module, env_id, "--env", EnvError)
    return target if isinstance(target, type) and issubclass(target, gymnasium.vector.VectorEnv) else None


def make_device_env(env_id: str, num_envs: int, device: str):
    """`num_envs` envs of the device env `env_id` on `device` (not reset yet), checked against the contract (an
    EnvError line naming what it breaks)."""
    make = device_env_class(env_id)  # its own EnvError lines (a module not found, a package not installed) as they are
    try:
        env = make(num_envs=num_envs, device=device)
    except Exception as exc:  # a user's class: its own error, where it was raised
        raise EnvError(
            f"--env {env_id}: {type(exc).__name__}: {exc} (built as Class(num_envs={num_envs}, device={device!r}))"
        ) from None
    if not is_device_env(env):
        raise EnvError(f"--env {env_id}: a VectorEnv needs a torch.device `device` attribute to run on a device")
    check_device_env(env, env_id)
    return env


def is_device_env(env) -> bool:
    """Whether `env` claims the contract: a VectorEnv with a torch device."""
    import torch

    return isinstance(env, gymnasium.vector.VectorEnv) and isinstance(getattr(env, "device", None), torch.device)


def check_device_env(env, name: str) -> None:
    """EnvError in one line naming what of the contract `env` (made from `name`) does not keep."""
    spaces = gymnasium.spaces
    if not isinstance(env.single_observation_space, spaces.Box):
        raise EnvError(
            f"device env {name}: single_observation_space must be a Box (got {env.single_observation_space})"
        )
    if not isinstance(env.single_action_space, (spaces.Discrete, spaces.Box)):
        raise EnvError(
            f"device env {name}: single_action_space must be Discrete or Box (got {env.single_action_space})"
        )
    mode = env.metadata.get("autoreset_mode")
    if mode not in AUTORESET_MODES:
        raise EnvError(
            f"device env {name}: metadata['autoreset_mode'] must be AutoresetMode.NEXT_STEP or SAME_STEP (got {mode})"
        )
    if not isinstance(env.num_envs, int) or env.num_envs < 1:
        raise EnvError(f"device env {name}: num_envs must be a positive int (got {env.num_envs!r})")


class DeviceBatchEnv:
    """A device env seen as a BatchEnv (envs.batch): NumPy in and out, for what plays whole episodes outside training
    (evaluation, enjoy.py, load_policy); training samples a device env without NumPy (device mode). Made reset with
    `seed`. `resets_next_step`: False for a SAME_STEP env, whose step after an end belongs to the new episode."""

    def __init__(self, env, spec, seed: int):
        self._env, self.num_envs, self.spec = env, env.num_envs, spec
        self.resets_next_step = env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
        env.reset(seed=seed)

    def reset(self) -> dict:
        obs, _ = self._env.reset()
        return {"obs": obs.cpu().numpy()}

    def step(self, actions):
        import torch

        actions = torch.as_tensor(self.spec.action.env_actions(actions), device=self._env.device)
        obs, rewards, terminated, truncated, _ = (
            value.cpu().numpy() if hasattr(value, "cpu") else value for value in self._env.step(actions)
        )
        return StepResult({"obs": obs}, rewards, terminated, truncated, rewards, terminated | truncated)

    def render(self):
        return None

    render_fps = None

    def close(self) -> None:
        self._env.close()
