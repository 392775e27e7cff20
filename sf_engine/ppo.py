"""Algorithm math as pure tensor functions: GAE, V-trace, PPO losses. No process plumbing here.

Runs in the learner. Time-major shapes: T = rollout, N = trajectories in the batch.
  rewards, terminated, dones, valid, log-probs: [T, N];  values: [T+1, N] (row T bootstraps).
`dones` = terminated | truncated. A step with valid = False is the reset step after an episode end
(EnvPool / Gymnasium 1.x next-step reset): it gets advantage 0 and is masked out of the losses.
On truncation the step bootstraps from the value of its last observation (values[t+1]); on
termination it does not.
"""
from __future__ import annotations

import torch


def gae(rewards, values, terminated, dones, valid, gamma: float, gae_lambda: float):
    """Generalized advantage estimation. Returns (advantages [T, N], returns [T, N])."""
    not_terminal, not_done, valid = 1.0 - terminated.float(), 1.0 - dones.float(), valid.float()
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        delta = rewards[t] + gamma * values[t + 1] * not_terminal[t] - values[t]
        last = (delta + gamma * gae_lambda * not_done[t] * last) * valid[t]
        advantages[t] = last
    return advantages, advantages + values[:-1] * valid


def vtrace(behavior_log_probs, target_log_probs, rewards, values, terminated, dones, valid,
           gamma: float, rho_bar: float, c_bar: float):
    """V-trace targets vs [T, N] and policy-gradient advantages [T, N] (IMPALA, lambda = 1)."""
    rho = torch.exp(target_log_probs - behavior_log_probs)
    clipped_rho, clipped_c = rho.clamp(max=rho_bar), rho.clamp(max=c_bar)
    not_terminal, not_done, valid_f = 1.0 - terminated.float(), 1.0 - dones.float(), valid.float()
    num_steps = rewards.shape[0]
    vs_minus_v = torch.zeros_like(rewards)
    carry = torch.zeros_like(rewards[0])
    for t in reversed(range(num_steps)):
        delta = clipped_rho[t] * (rewards[t] + gamma * not_terminal[t] * values[t + 1] - values[t])
        carry = (delta + gamma * clipped_c[t] * not_done[t] * carry) * valid_f[t]
        vs_minus_v[t] = carry
    vs = values[:-1] + vs_minus_v
    # the next state's target: vs[t+1] inside an episode, the plain value where the trajectory or episode ends
    next_vs = values[1:].clone()
    next_vs[:-1] = torch.where(dones[:-1].bool(), values[1:-1], vs[1:])
    advantages = clipped_rho * (rewards + gamma * not_terminal * next_vs - values[:-1]) * valid_f
    return vs * valid_f, advantages


def ppo_losses(new_log_probs, old_log_probs, advantages, new_values, returns, entropy,
               clip_ratio: float):
    """Clipped PPO objective pieces on a minibatch of valid samples [B].
    Returns (policy_loss, value_loss, entropy_mean, approx_kl, clip_fraction), scalars."""
    log_ratio = new_log_probs - old_log_probs
    ratio = log_ratio.exp()
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio) * advantages
    policy_loss = -torch.min(unclipped, clipped).mean()
    value_loss = 0.5 * (new_values - returns).pow(2).mean()
    with torch.no_grad():
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        clip_fraction = ((ratio - 1.0).abs() > clip_ratio).float().mean()
    return policy_loss, value_loss, entropy.mean(), approx_kl, clip_fraction


class DiscretePPOLoss(torch.autograd.Function):
    """The whole clipped PPO loss of categorical actions as one autograd node: forward and backward
    written out (about 0.25 against 0.44 ms per CartPole minibatch of 1,024 on one core, where every
    op of the loss costs its dispatch). logits [B, n], values [B] -> (loss, stats [5]: policy loss,
    value loss, mean entropy, approx KL, clip fraction); the same maths, values and gradients as
    ppo_losses on log_softmax (tests/test_ppo.py)."""

    @staticmethod
    def forward(ctx, logits, values, actions, old_log_probs, advantages, returns, clip_ratio: float,
                value_loss_coeff: float, entropy_coeff: float):
        log_pi = torch.log_softmax(logits, dim=-1)
        pi = log_pi.exp()
        log_ratio = log_pi.gather(1, actions.unsqueeze(1)).squeeze(1) - old_log_probs
        ratio = log_ratio.exp()
        unclipped = ratio * advantages
        clipped = ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio) * advantages
        unclipped_taken = unclipped <= clipped  # where the minimum's gradient flows (ties: through both, summing to it)
        policy_loss = -torch.where(unclipped_taken, unclipped, clipped).mean()
        entropy = -(pi * log_pi).sum(-1)
        error = values - returns
        value_loss = 0.5 * error.square().mean()
        entropy_mean = entropy.mean()
        stats = torch.stack([policy_loss, value_loss, entropy_mean, ((ratio - 1.0) - log_ratio).mean(),
                             ((ratio - 1.0).abs() > clip_ratio).float().mean()])
        ctx.save_for_backward(pi, log_pi, actions, ratio * advantages * unclipped_taken, entropy, error)
        ctx.coeffs = (value_loss_coeff, entropy_coeff)
        ctx.mark_non_differentiable(stats)
        return policy_loss + value_loss_coeff * value_loss - entropy_coeff * entropy_mean, stats

    @staticmethod
    def backward(ctx, grad_loss, grad_stats):
        pi, log_pi, actions, policy_weight, entropy, error = ctx.saved_tensors
        value_loss_coeff, entropy_coeff = ctx.coeffs
        scale = grad_loss / pi.shape[0]
        d_log_prob = policy_weight * -scale  # d loss / d log pi(a): d log pi(a) / d logits = onehot(a) - pi
        grad_logits = pi * -d_log_prob.unsqueeze(1)
        grad_logits.scatter_add_(1, actions.unsqueeze(1), d_log_prob.unsqueeze(1))
        if entropy_coeff:  # d entropy / d logits = -pi (log pi + entropy)
            grad_logits += (scale * entropy_coeff) * pi * (log_pi + entropy.unsqueeze(1))
        return grad_logits, (scale * value_loss_coeff) * error, None, None, None, None, None, None, None


def normalize(advantages: torch.Tensor) -> torch.Tensor:
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8)


def sequence_index(num_steps: int, num_traj: int, recurrence: int) -> torch.Tensor:
    """Cuts a time-major [T, N] batch into whole sequences for truncated BPTT: returns [R, M] indices
    into the flattened batch (t * N + n), M = T / R x N; column j is sequence j, the R consecutive
    steps c * R .. c * R + R - 1 of trajectory n (j = c * N + n). Minibatches pick columns, so a
    sequence is never split."""
    chunks = num_steps // recurrence
    t = torch.arange(num_steps).reshape(chunks, recurrence)  # [C, R]
    flat = t.unsqueeze(-1) * num_traj + torch.arange(num_traj)  # [C, R, N]
    return flat.permute(1, 0, 2).reshape(recurrence, chunks * num_traj)
