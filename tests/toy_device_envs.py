"""Small device envs for the tests (used as --env toy_device_envs:Name with tests/ on the path)."""

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from sf_engine.envs.torch_envs import TorchVectorEnv


class CountdownDeviceEnv(TorchVectorEnv):
    """Env i observes [its episode's step t, i]; reward 1 every step; an even env's episodes terminate at t = 3, an
    odd env's would end at t = 5 but the 4-step limit truncates them: what lands in each slot row can be checked.
    Resets on the same step (the default) or, as NextStepCountdownDeviceEnv, on the next."""

    max_episode_steps, state_size = 4, 2
    single_observation_space = spaces.Box(0.0, 100.0, (2,), np.float32)
    single_action_space = spaces.Discrete(2)

    def initial_state(self, count: int) -> torch.Tensor:
        rows = torch.arange(count, dtype=torch.float64, device=self.device)
        return torch.stack((torch.zeros_like(rows), rows), 1)

    def physics(self, state: torch.Tensor, actions: torch.Tensor) -> tuple:
        step, row = state.unbind(1)
        step = step + 1
        terminated = (step >= torch.where(row % 2 == 0, 3.0, 5.0)).to(torch.bool)
        return torch.stack((step, row), 1), torch.ones_like(step), terminated

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        return state.to(torch.float32)


class NextStepCountdownDeviceEnv(CountdownDeviceEnv):
    def __init__(self, num_envs: int = 1, device="cpu"):
        super().__init__(num_envs, device, autoreset_mode=AutoresetMode.NEXT_STEP)


class NonFiniteCountdownDeviceEnv(CountdownDeviceEnv):
    """CountdownDeviceEnv where env 1 observes NaN at t = 2 and env 2's step to t = 1 is rewarded +inf."""

    def physics(self, state: torch.Tensor, actions: torch.Tensor) -> tuple:
        state, rewards, terminated = super().physics(state, actions)
        step, row = state.unbind(1)
        return state, torch.where((row == 2) & (step == 1), torch.inf, rewards), terminated

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        step, row = state.unbind(1)
        return torch.where(((row == 1) & (step == 2)).unsqueeze(1), torch.nan, state).to(torch.float32)
