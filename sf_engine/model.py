"""Actor-critic networks, action sampling, and the flat parameter vector that is shared between processes.

Runs in the policy worker (inference) and the learner (training). Shapes: obs [B, *obs_shape] ->
logits [B, num_actions], values [B].
"""
from __future__ import annotations

import math

import torch
from torch import nn


def _layer(in_size: int, out_size: int, gain: float) -> nn.Linear:
    """Orthogonal init as in the PPO literature (sqrt(2) hidden, 0.01 policy head, 1 value head)."""
    layer = nn.Linear(in_size, out_size)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(in_size: int, hidden: int, out_size: int, out_gain: float) -> nn.Sequential:
    return nn.Sequential(_layer(in_size, hidden, math.sqrt(2)), nn.Tanh(),
                         _layer(hidden, hidden, math.sqrt(2)), nn.Tanh(),
                         _layer(hidden, out_size, out_gain))


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs over a flattened vector observation."""

    def __init__(self, obs_shape: tuple, num_actions: int, hidden_size: int):
        super().__init__()
        obs_size = int(math.prod(obs_shape))
        self.actor = _mlp(obs_size, hidden_size, num_actions, 0.01)
        self.critic = _mlp(obs_size, hidden_size, 1, 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = obs.reshape(obs.shape[0], -1).float()
        return self.actor(x), self.critic(x).squeeze(-1)

    def values(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs.reshape(obs.shape[0], -1).float()).squeeze(-1)


def sample_actions(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Categorical sample by the Gumbel-max trick (one fused pass, no torch.distributions overhead).
    Returns actions [B] (int64) and their log-probabilities [B]."""
    gumbel = torch.empty_like(logits).exponential_().log_().neg_()
    actions = torch.argmax(logits + gumbel, dim=-1)
    log_probs = torch.log_softmax(logits, dim=-1).gather(1, actions.unsqueeze(1)).squeeze(1)
    return actions, log_probs


def log_prob_entropy(logits: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of `actions` [B] and entropies [B] of the categorical given by `logits` [B, A]."""
    log_pi = torch.log_softmax(logits, dim=-1)
    entropy = -(log_pi.exp() * log_pi).sum(-1)
    return log_pi.gather(1, actions.unsqueeze(1)).squeeze(1), entropy


def flatten_parameters(model: nn.Module) -> torch.Tensor:
    """Make every parameter a view into one flat tensor (returned), so that publishing and loading the
    weights is a single copy."""
    params = list(model.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params]).contiguous()
    offset = 0
    for p in params:
        n = p.numel()
        p.data = flat[offset:offset + n].view_as(p)
        offset += n
    return flat
