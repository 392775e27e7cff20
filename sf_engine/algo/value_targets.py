"""Value-based targets as pure functions: n-step transitions for a replay buffer (the DQN family), PQN's
Q(lambda) returns over trajectories, (double) DQN targets and R2D2's sequence priorities. No process plumbing
here; runs in the learner.

Shapes: T = rollout, N = trajectories (a slot's rows side by side), B = sampled transitions, A = actions.
The slot conventions of sf_engine.algo.targets hold: obs row t is the observation the action of step t
was taken from, obs row T bootstraps; `dones` = terminated | truncated. An env resets on the step after
an episode ends (EnvPool / Gymnasium 1.x), so when step t ends an episode, obs row t+1 is that episode's
last observation and step t+1 is the reset step (valid False, never trained on). A terminated step
bootstraps nothing; a truncated one bootstraps from obs row t+1. A step may also be invalid with no done
before it (an absent agent, a step skipped for a non-finite value).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .targets import backward_recursion


class NStep(NamedTuple):
    """n-step transitions, one per start step t, each [T, N]. The transition of step t goes from obs row t
    to obs row t + steps[t]: returns[t] + discounts[t] * max_a Q(obs row t + steps[t], a) is its target."""

    returns: np.ndarray  # float32: sum_{i < steps} gamma^i r[t+i]
    steps: np.ndarray  # int64: steps taken, 1 .. n_step (0 where valid[t] is False)
    discounts: np.ndarray  # float32: gamma^steps, 0 after a terminated step (and where valid[t] is False)
    trainable: np.ndarray  # bool: valid[t] and every later step of the window valid


def n_step_transitions(rewards, terminated, truncated, valid, gamma: float, n_step: int) -> NStep:
    """n-step transitions from every step of a time-major batch (NumPy): rewards float32 [T, N];
    terminated, truncated, valid bool [T, N]. Returns NStep, each field [T, N].

    The window of start step t takes k steps t .. t+k-1: k stops at n_step, at the first done step
    (included: the window never crosses a reset) or at the slot's end (t + k <= T, obs row T being the
    bootstrap row). Its next observation is obs row t + k, which the caller gathers: the episode's last
    observation when the window ended on a done step, so a truncated window bootstraps from it (discount
    gamma^k) and a terminated one bootstraps nothing (discount 0).
    Not trainable: a start step with valid False (its returns, steps and discounts are 0), and a window
    with an invalid step t+i, 0 < i < k (an absent agent, a skipped step: its reward is not the
    transition's; it adds 0 to returns). Vectorised over N: a loop over the window's min(n_step, T) steps.
    """
    num_steps = rewards.shape[0]
    dones = terminated | truncated
    returns = np.zeros(rewards.shape, np.float32)
    steps = np.zeros(rewards.shape, np.int64)
    ended_terminal = np.zeros(rewards.shape, bool)
    trainable = valid.copy()
    taking = valid.copy()  # the window of start t takes its next step t + i
    for i in range(min(n_step, num_steps)):
        starts = slice(0, num_steps - i)  # the start steps whose step t + i is in the slot
        take = taking[starts]
        returns[starts] += np.where(take & valid[i:], np.float32(gamma**i) * rewards[i:], np.float32(0.0))
        steps[starts] += take
        if i > 0:
            trainable[starts] &= ~(take & ~valid[i:])
        ended_terminal[starts] |= take & terminated[i:]
        taking[starts] &= ~dones[i:]
    discounts = np.where(ended_terminal | ~valid, 0.0, np.power(gamma, steps, dtype=np.float64))
    return NStep(returns, steps, discounts.astype(np.float32), trainable)


def q_lambda_returns(rewards, next_max_q, terminated, dones, valid, gamma: float, q_lambda: float):
    """PQN's Q(lambda) targets (Gallici et al. 2024), torch, each [T, N]: rewards; next_max_q =
    M[t+1] = max_a Q(obs row t+1, a) over the legal actions, computed by the caller without gradient;
    terminated, dones, valid. Returns the targets G [T, N]:
      G[t] = r[t] + gamma * (1 - terminated[t]) * ((1 - lambda) * M[t+1] + lambda * G[t+1])
    where the lambda part continues into step t+1 only inside the episode and the slot: at a done step
    (truncated: bootstrap from M[t+1], the last observation; terminated: nothing), at the last row
    t = T-1, and before an invalid step (whose target is 0) the target is r[t] + gamma * (1 -
    terminated[t]) * M[t+1]. Invalid steps get 0. lambda = 0: one-step Q-learning targets."""
    valid_f = valid.float()
    continues = (1.0 - dones.float()) * torch.cat([valid_f[1:], torch.zeros_like(valid_f[:1])])
    bootstrap = gamma * (1.0 - terminated.float()) * next_max_q
    delta = rewards + bootstrap * (1.0 - q_lambda * continues)
    return backward_recursion(delta, (gamma * q_lambda) * continues, valid_f)


@torch.no_grad()
def double_q_targets(returns, discounts, next_q_online, next_q_target, next_legal=None, double: bool = True):
    """(Double) DQN targets [B], without gradient: returns + discounts * Q_target(s', a') with a' =
    argmax_a Q_online(s', a) (double DQN, van Hasselt et al. 2016), or max_a Q_target(s', a) with
    `double` False (`next_q_online` is then unused). returns, discounts [B] (NStep's, or one-step ones);
    next_q_online, next_q_target [B, A]: the online and target networks' values of the next observation.
    Both the argmax and the max range over the legal actions only: `next_legal` bool [B, A], None for all
    legal; a row with no legal action (a terminal observation, whose discount is 0) uses all actions."""
    illegal = None if next_legal is None else ~(next_legal | ~next_legal.any(dim=1, keepdim=True))
    chooser = next_q_online if double else next_q_target  # the values whose (legal) best action counts
    if illegal is not None:
        chooser = chooser.masked_fill(illegal, -torch.inf)
    if double:
        next_value = next_q_target.gather(1, chooser.argmax(dim=1, keepdim=True)).squeeze(1)
    else:
        next_value = chooser.amax(dim=1)
    return returns + discounts * next_value


def sequence_priorities(td_abs: torch.Tensor, trainable: torch.Tensor, eta: float) -> torch.Tensor:
    """R2D2's sequence priorities [B]: eta * max + (1 - eta) * mean of |TD error| over each sequence's trainable
    steps. td_abs [L, B] (|TD error| of each step), trainable [L, B] bool (a sequence without one gets 0)."""
    td_abs = torch.where(trainable, td_abs, torch.zeros_like(td_abs))
    mean = td_abs.sum(dim=0) / trainable.sum(dim=0).clamp(min=1)
    return eta * td_abs.amax(dim=0) + (1.0 - eta) * mean
