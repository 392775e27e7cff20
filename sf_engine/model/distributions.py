"""Action distributions of the policy head: categorical (per dimension for MultiDiscrete) and diagonal
Gaussian. Runs in the policy worker (sampling) and the learner (log-probs, entropies)."""

from __future__ import annotations

import math

import torch


class ActionDistribution:
    """Categorical (per dimension for MultiDiscrete) or diagonal Gaussian with a learned log-std.
    Parameters [B, P]: concatenated logits, or Gaussian means (log-std is a separate parameter)."""

    def __init__(self, action_spec):
        self.kind, self.nvec = action_spec.kind, list(action_spec.nvec)
        self.num_params = sum(self.nvec) if self.kind != "continuous" else action_spec.shape[0]

    def _split(self, params):
        return params.split(self.nvec, dim=-1)

    def sample(self, params, log_std=None):
        """Returns actions ([B] int64, [B, K] int64, or [B, A] float32 unclipped) and log-probs [B]."""
        if self.kind == "continuous":
            std = log_std.exp()
            actions = params + std * torch.randn_like(params)
            return actions, self.log_prob_entropy(params, actions, log_std)[0]
        if self.kind == "discrete":  # one categorical: its log-softmax serves the sampling and the log-prob
            log_pi = torch.log_softmax(params, dim=-1)
            actions = torch.argmax(log_pi - torch.empty_like(log_pi).exponential_().log_(), dim=-1)  # Gumbel-max
            return actions, log_pi.gather(1, actions.unsqueeze(1)).squeeze(1)
        chosen = []
        for logits in self._split(params):
            gumbel = torch.empty_like(logits).exponential_().log_().neg_()  # Gumbel-max sampling
            chosen.append(torch.argmax(logits + gumbel, dim=-1))
        actions = torch.stack(chosen, dim=-1)
        return actions, self.log_prob_entropy(params, actions, with_entropy=False)[0]  # acting needs no entropy

    def log_prob_entropy(self, params, actions, log_std=None, with_entropy: bool = True):
        """Log-probabilities [B] of `actions` and entropies [B] (categorical: None without
        `with_entropy`)."""
        if self.kind == "continuous":
            log_std = log_std.expand_as(params)
            log_prob = -0.5 * ((actions - params) / log_std.exp()).pow(2) - log_std - 0.5 * math.log(2 * math.pi)
            entropy = 0.5 + 0.5 * math.log(2 * math.pi) + log_std
            return log_prob.sum(-1), entropy.sum(-1)
        columns = actions.unsqueeze(-1) if self.kind == "discrete" else actions
        log_prob, entropy = 0.0, (0.0 if with_entropy else None)
        for i, logits in enumerate(self._split(params)):
            log_pi = torch.log_softmax(logits, dim=-1)
            log_prob = log_prob + log_pi.gather(1, columns[:, i : i + 1]).squeeze(1)
            if with_entropy:
                entropy = entropy - (log_pi.exp() * log_pi).sum(-1)
        return log_prob, entropy

    def mode(self, params):
        if self.kind == "continuous":
            return params
        best = [logits.argmax(-1) for logits in self._split(params)]
        return best[0] if self.kind == "discrete" else torch.stack(best, dim=-1)
