"""Algorithm math as pure tensor functions: GAE, V-trace, PPO losses. No process plumbing here.

Runs in the learner. Time-major shapes: T = rollout, N = trajectories in the batch.
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

from sf_engine.model.kernels import KERNELS, use_kernels


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
    logits,
    values,
    actions,
    old_log_probs,
    advantages,
    returns,
    clip_ratio: float,
    value_loss_coeff: float,
    entropy_coeff: float,
    kernels: bool = None,
):
    """The clipped PPO loss of categorical actions and its gradients, written out: logits [B, n], values
    [B] -> (loss, stats [5]: policy loss, value loss, mean entropy, approx KL, clip fraction, d loss / d
    logits [B, n], d loss / d values [B]). On the CPU one compiled call (kernels.KERNELS.ppo_discrete_loss);
    elsewhere the same maths as torch ops. `kernels` forces one way (True/False); None: the kernel where
    it runs. The values and gradients of ppo_losses on log_softmax (tests/test_ppo.py)."""
    if kernels if kernels is not None else use_kernels(logits):
        return tuple(
            KERNELS.ppo_discrete_loss(
                logits, values, actions, old_log_probs, advantages, returns, clip_ratio, value_loss_coeff, entropy_coeff
            )
        )
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
        clip_ratio: float,
        value_loss_coeff: float,
        entropy_coeff: float,
        kernels: bool = None,
    ):
        loss, stats, grad_logits, grad_values = discrete_loss_and_grads(
            logits,
            values,
            actions,
            old_log_probs,
            advantages,
            returns,
            clip_ratio,
            value_loss_coeff,
            entropy_coeff,
            kernels,
        )
        ctx.save_for_backward(grad_logits, grad_values)  # the loss's own gradients, scaled by the incoming one
        ctx.mark_non_differentiable(stats)
        return loss, stats

    @staticmethod
    def backward(ctx, grad_loss, grad_stats):
        grad_logits, grad_values = ctx.saved_tensors
        return grad_logits * grad_loss, grad_values * grad_loss, None, None, None, None, None, None, None, None


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
