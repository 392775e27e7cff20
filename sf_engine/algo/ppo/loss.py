"""PPO's losses as pure tensor functions: the clipped objective's pieces, the fused categorical loss with
its gradients (and its autograd node), advantage normalization, and the cut of a batch into whole
sequences for truncated BPTT. No process plumbing here; runs in the learner, on minibatches [B].
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from sf_engine.model.kernels import KERNELS, use_kernels


class LossCoefficients(NamedTuple):
    """The clipped PPO loss's constants: clipping of the policy ratio to [1 - clip, 1 + clip], and the
    weights of the value loss and of the entropy bonus."""

    clip_ratio: float
    value_loss_coeff: float
    entropy_coeff: float


def ppo_losses(new_log_probs, old_log_probs, advantages, new_values, returns, entropy, clip_ratio: float, weight=None):
    """Clipped PPO objective pieces on a minibatch of valid samples [B]. `weight` [B] (0/1, turn-based
    games: whether the agent was to move) limits the policy's pieces (loss, entropy, KL, clip fraction)
    to the samples it marks; the value loss covers them all.
    Returns (policy_loss, value_loss, entropy_mean, approx_kl, clip_fraction), scalars."""
    mean = (lambda x: x.mean()) if weight is None else (lambda x: (x * weight).sum() / weight.sum().clamp(min=1.0))
    log_ratio = new_log_probs - old_log_probs
    ratio = log_ratio.exp()
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio) * advantages
    policy_loss = -mean(torch.min(unclipped, clipped))
    value_loss = 0.5 * (new_values - returns).pow(2).mean()
    with torch.no_grad():
        approx_kl = mean((ratio - 1.0) - log_ratio)
        clip_fraction = mean(((ratio - 1.0).abs() > clip_ratio).float())
    return policy_loss, value_loss, mean(entropy), approx_kl, clip_fraction


def discrete_loss_and_grads(
    logits, values, actions, old_log_probs, advantages, returns, coefficients: LossCoefficients, kernels: bool = None
):
    """The clipped PPO loss of categorical actions and its gradients, written out: logits [B, n], values
    [B] -> (loss, stats [5]: policy loss, value loss, mean entropy, approx KL, clip fraction, d loss / d
    logits [B, n], d loss / d values [B]). On the CPU one compiled call (kernels.KERNELS.ppo_discrete_loss);
    elsewhere the same maths as torch ops. `kernels` forces one way (True/False); None: the kernel where
    it runs. The values and gradients of ppo_losses on log_softmax (tests/test_ppo.py)."""
    if kernels if kernels is not None else use_kernels(logits):
        return tuple(
            KERNELS.ppo_discrete_loss(logits, values, actions, old_log_probs, advantages, returns, *coefficients)
        )
    clip_ratio, value_loss_coeff, entropy_coeff = coefficients
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
    stats = torch.stack(
        [
            policy_loss,
            value_loss,
            entropy_mean,
            ((ratio - 1.0) - log_ratio).mean(),
            ((ratio - 1.0).abs() > clip_ratio).float().mean(),
        ]
    )
    scale = 1.0 / logits.shape[0]
    d_log_prob = ratio * advantages * unclipped_taken * -scale  # d log pi(a) / d logits = onehot(a) - pi
    grad_logits = pi * -d_log_prob.unsqueeze(1)
    grad_logits.scatter_add_(1, actions.unsqueeze(1), d_log_prob.unsqueeze(1))
    if entropy_coeff:  # d entropy / d logits = -pi (log pi + entropy)
        grad_logits += (scale * entropy_coeff) * pi * (log_pi + entropy.unsqueeze(1))
    loss = policy_loss + value_loss_coeff * value_loss - entropy_coeff * entropy_mean
    return loss, stats, grad_logits, (scale * value_loss_coeff) * error


class DiscretePPOLoss(torch.autograd.Function):
    """discrete_loss_and_grads as one autograd node (about 0.25 ms per CartPole minibatch of 1,024 on one
    core less than autograd through the loss's ops, each of which costs its dispatch): (loss, stats)."""

    @staticmethod
    def forward(
        ctx,
        logits,
        values,
        actions,
        old_log_probs,
        advantages,
        returns,
        coefficients: LossCoefficients,
        kernels: bool = None,
    ):
        loss, stats, grad_logits, grad_values = discrete_loss_and_grads(
            logits, values, actions, old_log_probs, advantages, returns, coefficients, kernels
        )
        ctx.save_for_backward(grad_logits, grad_values)  # the loss's own gradients, scaled by the incoming one
        ctx.mark_non_differentiable(stats)
        return loss, stats

    @staticmethod
    def backward(ctx, grad_loss, grad_stats):
        grad_logits, grad_values = ctx.saved_tensors
        return grad_logits * grad_loss, grad_values * grad_loss, None, None, None, None, None, None


def normalize(advantages: torch.Tensor, weight=None) -> torch.Tensor:
    """Advantages to zero mean and unit std (over the samples `weight` marks, where given)."""
    if weight is None:
        return (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    count = weight.sum().clamp(min=1.0)
    mean = (advantages * weight).sum() / count
    std = (((advantages - mean) * weight).square().sum() / (count - 1.0).clamp(min=1.0)).sqrt()
    return (advantages - mean) / (std + 1e-8) * weight


def sequence_index(num_steps: int, num_traj: int, recurrence: int) -> torch.Tensor:
    """Cuts a time-major [T, N] batch into whole sequences for truncated BPTT: returns [R, M] indices
    into the flattened batch (t * N + n), M = T / R x N; column j is sequence j, the R consecutive
    steps c * R .. c * R + R - 1 of trajectory n (j = c * N + n). Minibatches pick columns, so a
    sequence is never split."""
    chunks = num_steps // recurrence
    t = torch.arange(num_steps).reshape(chunks, recurrence)  # [C, R]
    flat = t.unsqueeze(-1) * num_traj + torch.arange(num_traj)  # [C, R, N]
    return flat.permute(1, 0, 2).reshape(recurrence, chunks * num_traj)
