"""Device envs written in torch (envs.device's contract): `TorchVectorEnv`, a base that does seeding, the time limit
and both autoreset modes once, and Gymnasium's CartPole-v1, Acrobot-v1 and Pendulum-v1 on it, with the same dynamics,
rewards, terminations and time limits as Gymnasium's own implementations (tests/test_device_envs.py steps both from
the same states and actions), named by the ids TorchCartPole-v1, TorchAcrobot-v1 and TorchPendulum-v1
(envs.device.DEVICE_ENV_IDS)."""

from __future__ import annotations

import math

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from .batch import AUTORESET_MODES


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


class TorchCartPole(TorchVectorEnv):
    """CartPole-v1: push the cart left (0) or right (1); +1 every step until the pole leans past 12 degrees or the
    cart leaves [-2.4, 2.4] (the last step rewarded too), 500 steps at most. Explicit Euler, as Gymnasium's."""

    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    total_mass, polemass_length = masspole + masscart, masspole * length
    theta_threshold, x_threshold = 12 * 2 * math.pi / 360, 2.4
    max_episode_steps, state_size = 500, 4
    high = np.array([x_threshold * 2, np.inf, theta_threshold * 2, np.inf], dtype=np.float32)
    single_observation_space = spaces.Box(-high, high, dtype=np.float32)
    single_action_space = spaces.Discrete(2)

    def initial_state(self, count: int) -> torch.Tensor:
        return self.uniform(count, [-0.05] * 4, [0.05] * 4)

    def physics(self, state: torch.Tensor, actions: torch.Tensor) -> tuple:
        x, x_dot, theta, theta_dot = state.unbind(1)
        force = torch.where(actions.reshape(-1) == 1, self.force_mag, -self.force_mag).to(torch.float64)
        costheta, sintheta = torch.cos(theta), torch.sin(theta)
        temp = (force + self.polemass_length * theta_dot.square() * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta.square() / self.total_mass)
        )
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        x, x_dot = x + self.tau * x_dot, x_dot + self.tau * xacc
        theta, theta_dot = theta + self.tau * theta_dot, theta_dot + self.tau * thetaacc
        terminated = (x.abs() > self.x_threshold) | (theta.abs() > self.theta_threshold)
        return torch.stack((x, x_dot, theta, theta_dot), 1), torch.ones_like(x), terminated

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        return state.to(torch.float32)


class TorchAcrobot(TorchVectorEnv):
    """Acrobot-v1: a torque of -1, 0 or +1 on the joint between two links; -1 every step until the tip swings
    above the bar (0 on that step), 500 steps at most. Fourth-order Runge-Kutta over one 0.2-s step, the book's
    dynamics, angles wrapped and velocities bounded, as Gymnasium's."""

    dt, link_length, link_mass, link_com, link_moi = 0.2, 1.0, 1.0, 0.5, 1.0
    max_vel_1, max_vel_2 = 4 * math.pi, 9 * math.pi
    max_episode_steps, state_size = 500, 4
    high = np.array([1.0, 1.0, 1.0, 1.0, max_vel_1, max_vel_2], dtype=np.float32)
    single_observation_space = spaces.Box(-high, high, dtype=np.float32)
    single_action_space = spaces.Discrete(3)

    def initial_state(self, count: int) -> torch.Tensor:
        # Gymnasium draws float32 first states: the same values here, kept in float64
        return self.uniform(count, [-0.1] * 4, [0.1] * 4).to(torch.float32).to(torch.float64)

    def derivatives(self, state: torch.Tensor, torque: torch.Tensor) -> torch.Tensor:
        m, length, lc, moi, g = self.link_mass, self.link_length, self.link_com, self.link_moi, 9.8
        theta1, theta2, dtheta1, dtheta2 = state.unbind(1)
        d1 = m * lc**2 + m * (length**2 + lc**2 + 2 * length * lc * torch.cos(theta2)) + 2 * moi
        d2 = m * (lc**2 + length * lc * torch.cos(theta2)) + moi
        phi2 = m * lc * g * torch.cos(theta1 + theta2 - math.pi / 2.0)
        phi1 = (
            -m * length * lc * dtheta2**2 * torch.sin(theta2)
            - 2 * m * length * lc * dtheta2 * dtheta1 * torch.sin(theta2)
            + (m * lc + m * length) * g * torch.cos(theta1 - math.pi / 2)
            + phi2
        )
        ddtheta2 = (torque + d2 / d1 * phi1 - m * length * lc * dtheta1**2 * torch.sin(theta2) - phi2) / (
            m * lc**2 + moi - d2**2 / d1
        )
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return torch.stack((dtheta1, dtheta2, ddtheta1, ddtheta2), 1)

    def physics(self, state: torch.Tensor, actions: torch.Tensor) -> tuple:
        torque = actions.reshape(-1).to(torch.float64) - 1.0
        half = self.dt / 2.0
        k1 = self.derivatives(state, torque)
        k2 = self.derivatives(state + half * k1, torque)
        k3 = self.derivatives(state + half * k2, torque)
        k4 = self.derivatives(state + self.dt * k3, torque)
        theta1, theta2, dtheta1, dtheta2 = (state + self.dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)).unbind(1)
        theta1, theta2 = wrap_angle(theta1), wrap_angle(theta2)
        dtheta1 = dtheta1.clamp(-self.max_vel_1, self.max_vel_1)
        dtheta2 = dtheta2.clamp(-self.max_vel_2, self.max_vel_2)
        terminated = -torch.cos(theta1) - torch.cos(theta2 + theta1) > 1.0
        reward = torch.where(terminated, 0.0, -1.0).to(torch.float64)
        return torch.stack((theta1, theta2, dtheta1, dtheta2), 1), reward, terminated

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        theta1, theta2, dtheta1, dtheta2 = state.unbind(1)
        parts = (torch.cos(theta1), torch.sin(theta1), torch.cos(theta2), torch.sin(theta2), dtheta1, dtheta2)
        return torch.stack(parts, 1).to(torch.float32)


def wrap_angle(angle: torch.Tensor) -> torch.Tensor:
    """`angle` moved by whole turns into [-pi, pi], as Gymnasium's Acrobot wraps (values on the bounds stay)."""
    turn = 2 * math.pi
    above = torch.ceil((angle - math.pi) / turn).clamp(min=0)
    below = torch.ceil((-math.pi - angle) / turn).clamp(min=0)
    return angle - above * turn + below * turn


class TorchPendulum(TorchVectorEnv):
    """Pendulum-v1: a torque within [-2, 2] swings a pendulum up; the reward is minus its angle's square, 0.1 of its
    speed's and 0.001 of the torque's; 200 steps, never terminated. Semi-implicit Euler, as Gymnasium's."""

    max_speed, max_torque, dt, g, m, length = 8.0, 2.0, 0.05, 10.0, 1.0, 1.0
    max_episode_steps, state_size = 200, 2
    high = np.array([1.0, 1.0, max_speed], dtype=np.float32)
    single_observation_space = spaces.Box(-high, high, dtype=np.float32)
    single_action_space = spaces.Box(-max_torque, max_torque, shape=(1,), dtype=np.float32)

    def initial_state(self, count: int) -> torch.Tensor:
        return self.uniform(count, [-math.pi, -1.0], [math.pi, 1.0])

    def physics(self, state: torch.Tensor, actions: torch.Tensor) -> tuple:
        theta, theta_dot = state.unbind(1)
        # the torque's terms in float32, as NumPy computes them from Gymnasium's float32 action
        torque = actions.reshape(-1).to(torch.float32).clamp(-self.max_torque, self.max_torque)
        normalized = torch.remainder(theta + math.pi, 2 * math.pi) - math.pi
        costs = normalized.square() + 0.1 * theta_dot.square() + (0.001 * torque.square()).to(torch.float64)
        push = (3.0 / (self.m * self.length**2) * torque).to(torch.float64)
        accel = 3 * self.g / (2 * self.length) * torch.sin(theta) + push
        theta_dot = (theta_dot + accel * self.dt).clamp(-self.max_speed, self.max_speed)
        theta = theta + theta_dot * self.dt
        return torch.stack((theta, theta_dot), 1), -costs, torch.zeros_like(theta, dtype=torch.bool)

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        theta, theta_dot = state.unbind(1)
        return torch.stack((torch.cos(theta), torch.sin(theta), theta_dot), 1).to(torch.float32)
