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

`TorchVectorEnv` is a base for writing one: the physics over a state tensor, with seeding, the time limit and both
autoreset modes done once here. envs/torch_classic.py holds the shipped ones.
"""

from __future__ import annotations

import gymnasium
import torch
from gymnasium.vector import AutoresetMode

from .spec import EnvError

AUTORESET_MODES = (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP)


def is_device_env(env) -> bool:
    """Whether `env` claims the contract: a VectorEnv with a torch device."""
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


class TorchVectorEnv(gymnasium.vector.VectorEnv):
    """A batch of `num_envs` envs as one torch program on `device`: a subclass sets the spaces and
    `max_episode_steps` and writes `initial_state`, `physics` and `observe`; seeding, the time limit and the
    autoreset mode are done here. The state is float64 (the Gymnasium envs' own precision), the observations
    float32."""

    max_episode_steps: int = 0
    state_size: int = 0

    def __init__(self, num_envs: int = 1, device: str | torch.device = "cpu", autoreset_mode=AutoresetMode.SAME_STEP):
        if autoreset_mode not in AUTORESET_MODES:
            raise ValueError(f"autoreset_mode must be NEXT_STEP or SAME_STEP (got {autoreset_mode})")
        self.num_envs, self.device = int(num_envs), torch.device(device)
        self.metadata = {"autoreset_mode": autoreset_mode}
        self.observation_space = gymnasium.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gymnasium.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.generator = torch.Generator(device=self.device)
        self.state = torch.zeros(self.num_envs, self.state_size, dtype=torch.float64, device=self.device)
        self.steps = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self.ended = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)  # NEXT_STEP: reset next step

    # ---- what a subclass writes -----------------------------------------------------------------------------
    def initial_state(self, count: int) -> torch.Tensor:
        """[count, state_size] float64 first states, drawn with self.generator."""
        raise NotImplementedError

    def physics(self, state: torch.Tensor, actions: torch.Tensor) -> tuple:
        """One step of every env: (next state [N, S], reward [N] float64, terminated [N] bool)."""
        raise NotImplementedError

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        """[N, *obs_shape] float32 observations of `state`."""
        raise NotImplementedError

    # ---- the contract ---------------------------------------------------------------------------------------
    def uniform(self, count: int, low, high) -> torch.Tensor:
        """[count, len(low)] float64 uniform draws within [low, high) per column."""
        low = torch.as_tensor(low, dtype=torch.float64, device=self.device)
        high = torch.as_tensor(high, dtype=torch.float64, device=self.device)
        draws = torch.rand(count, low.numel(), dtype=torch.float64, device=self.device, generator=self.generator)
        return low + draws * (high - low)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.generator.manual_seed(int(seed))
        self.state = self.initial_state(self.num_envs)
        self.steps.zero_()
        self.ended.zero_()
        return self.observe(self.state), {}

    def step(self, actions: torch.Tensor):
        state, reward, terminated = self.physics(self.state, actions)
        self.steps += 1
        truncated = self.steps >= self.max_episode_steps
        reward = reward.to(torch.float32)
        if self.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP:
            restart = self.ended
            state = torch.where(restart.unsqueeze(1), self.initial_state(self.num_envs), state)
            self.steps.masked_fill_(restart, 0)
            reward.masked_fill_(restart, 0.0)
            terminated, truncated = terminated & ~restart, truncated & ~restart
            self.state, self.ended = state, terminated | truncated
            return self.observe(state), reward, terminated, truncated, {}
        final_obs = self.observe(state)
        done = terminated | truncated
        self.state = torch.where(done.unsqueeze(1), self.initial_state(self.num_envs), state)
        self.steps.masked_fill_(done, 0)
        return self.observe(self.state), reward, terminated, truncated, {"final_obs": final_obs}
