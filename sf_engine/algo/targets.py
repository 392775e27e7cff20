"""Advantage targets as pure tensor functions: GAE and V-trace, over time-major batches. No process
plumbing here; runs in the learner.

Shapes: T = rollout, N = trajectories in the batch.
  rewards, terminated, dones, valid, log-probs: [T, N];  values: [T+1, N] (row T bootstraps).
`dones` = terminated | truncated. A step with valid = False is the reset step after an episode end
(EnvPool / Gymnasium 1.x next-step reset), or an agent's absence from its game: it gets advantage 0
and is masked out of the losses. In a turn-based game an agent's waiting steps are ordinary steps of
its trajectory (an opponent's winning move is a reward at one of them, reaching the agent's move
before it through the recursion), but only the steps where it was to move train its policy.
On truncation the step bootstraps from the value of its last observation (values[t+1]); on
termination it does not.
"""

from __future__ import annotations

import numpy as np
import torch


def backward_recursion(delta, carry, valid, numpy: bool = None):
    """x[t] = (delta[t] + carry[t] * x[t + 1]) * valid[t], from t = T-1 down to 0 with x[T] = 0: the
    recursion of GAE and V-trace, [T, N]. On the CPU it runs over NumPy views of the tensors (`numpy`
    None; True/False force a way): its T steps are element-wise ops on rows of N, where a torch op
    costs about ten times a NumPy one (a CartPole batch's GAE: 0.75 against 0.075 ms)."""
    out = torch.empty_like(delta)
    if numpy if numpy is not None else delta.device.type == "cpu":
        delta, carry, valid, out_rows = delta.numpy(), carry.numpy(), valid.numpy(), out.numpy()
        last = np.zeros_like(delta[0])
    else:
        out_rows, last = out, torch.zeros_like(delta[0])
    for t in reversed(range(delta.shape[0])):
        last = (delta[t] + carry[t] * last) * valid[t]
        out_rows[t] = last
    return out


def gae(rewards, values, terminated, dones, valid, gamma: float, gae_lambda: float):
    """Generalized advantage estimation. Returns (advantages [T, N], returns [T, N])."""
    not_terminal, not_done, valid = 1.0 - terminated.float(), 1.0 - dones.float(), valid.float()
    delta = rewards + gamma * values[1:] * not_terminal - values[:-1]
    advantages = backward_recursion(delta, (gamma * gae_lambda) * not_done, valid)
    return advantages, advantages + values[:-1] * valid


def vtrace(
    behavior_log_probs,
    target_log_probs,
    rewards,
    values,
    terminated,
    dones,
    valid,
    gamma: float,
    rho_bar: float,
    c_bar: float,
):
    """V-trace targets vs [T, N] and policy-gradient advantages [T, N] (IMPALA, lambda = 1)."""
    rho = torch.exp(target_log_probs - behavior_log_probs)
    clipped_rho, clipped_c = rho.clamp(max=rho_bar), rho.clamp(max=c_bar)
    not_terminal, not_done, valid_f = 1.0 - terminated.float(), 1.0 - dones.float(), valid.float()
    delta = clipped_rho * (rewards + gamma * not_terminal * values[1:] - values[:-1])
    vs_minus_v = backward_recursion(delta, gamma * clipped_c * not_done, valid_f)
    vs = values[:-1] + vs_minus_v
    # the next state's target: vs[t+1] inside an episode, the plain value where the trajectory or episode ends
    next_vs = values[1:].clone()
    next_vs[:-1] = torch.where(dones[:-1].bool(), values[1:-1], vs[1:])
    advantages = clipped_rho * (rewards + gamma * not_terminal * next_vs - values[:-1]) * valid_f
    return vs * valid_f, advantages
