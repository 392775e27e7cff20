"""Action distributions of the policy head: categorical (per dimension for MultiDiscrete), independent
Bernoulli bits (MultiBinary), diagonal Gaussian, and the product of these over a Tuple or Dict action space's
parts. Runs in the policy worker (sampling) and the learner (log-probs, entropies)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from sf_engine.model import kernels


class ActionDistribution:
    """Categorical (per dimension for MultiDiscrete), Bernoulli per bit (MultiBinary: one logit each) or
    diagonal Gaussian with a learned log-std; for a composite action (ActionSpec.parts) the product of its
    parts' distributions. Parameters [B, P]: concatenated logits, or Gaussian means (log-std is a separate
    parameter of num_std entries: the Gaussian parts' dimensions one after the other)."""

    def __init__(self, action_spec):
        self.kind, self.nvec = action_spec.kind, list(action_spec.nvec)
        if self.kind == "composite":
            self.parts = [ActionDistribution(part) for part in action_spec.parts]
            self.param_sizes = [part.num_params for part in self.parts]
            self.widths = [part.width for part in action_spec.parts]
            self.std_sizes = [part.num_std for part in self.parts]
            self.num_params, self.num_std = sum(self.param_sizes), sum(self.std_sizes)
        else:
            self.num_params = sum(self.nvec) if self.nvec else action_spec.shape[0]
            self.num_std = self.num_params if self.kind == "continuous" else 0

    def _split(self, params):
        return params.split(self.nvec, dim=-1)

    def _by_part(self, params, actions=None, log_std=None):
        """Per part: (its distribution, its parameters, its actions in its own dtype or None, its log-std or None)."""
        params = params.split(self.param_sizes, dim=-1)
        columns = actions.split(self.widths, dim=-1) if actions is not None else [None] * len(self.parts)
        stds = log_std.split(self.std_sizes, dim=-1) if log_std is not None else [None] * len(self.parts)
        for part, p, cols, std in zip(self.parts, params, columns, stds):
            if cols is not None and part.kind != "continuous":
                cols = cols.long().squeeze(-1) if part.kind == "discrete" else cols.long()
            yield part, p, cols, std if part.kind == "continuous" else None

    @staticmethod
    def _as_columns(part, actions):
        """A part's actions as float32 columns [B, width] of a composite row."""
        return (actions.unsqueeze(-1) if part.kind == "discrete" else actions).float()

    def sample(self, params, log_std=None):
        """Returns actions ([B] int64, [B, K] int64, [B, A] float32 unclipped, or a composite's float32 columns
        [B, W]) and log-probs [B]."""
        if self.kind == "composite":
            chosen, log_prob = [], 0.0
            for part, p, _, std in self._by_part(params, log_std=log_std):
                actions, part_log_prob = part.sample(p, std)
                chosen.append(self._as_columns(part, actions))
                log_prob = log_prob + part_log_prob
            return torch.cat(chosen, dim=-1), log_prob
        if self.kind == "multi_binary":
            bits = (torch.rand_like(params) < torch.sigmoid(params)).long()
            return bits, self.log_prob_entropy(params, bits, with_entropy=False)[0]
        if self.kind == "continuous":
            std = log_std.exp()
            actions = params + std * torch.randn_like(params)
            return actions, self.log_prob_entropy(params, actions, log_std)[0]
        if self.kind == "discrete":  # one categorical: its log-softmax serves the sampling and the log-prob
            compiled = kernels.categorical_sample(params)
            if compiled is not None:
                return compiled
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
        """Log-probabilities [B] of `actions` and entropies [B] (categorical and Bernoulli: None without
        `with_entropy`)."""
        if self.kind == "composite":
            log_prob, entropy = 0.0, (0.0 if with_entropy else None)
            for part, p, cols, std in self._by_part(params, actions, log_std):
                part_log_prob, part_entropy = part.log_prob_entropy(p, cols, std, with_entropy)
                log_prob = log_prob + part_log_prob
                entropy = entropy + part_entropy if with_entropy else None
            return log_prob, entropy
        if self.kind == "multi_binary":  # log p(1) = log sigmoid(l), log p(0) = log sigmoid(-l)
            log_one, log_zero = F.logsigmoid(params), F.logsigmoid(-params)
            log_prob = torch.where(actions.bool(), log_one, log_zero).sum(-1)
            entropy = -(log_one.exp() * log_one + log_zero.exp() * log_zero).sum(-1) if with_entropy else None
            return log_prob, entropy
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
        """The most likely action (a composite's parts' modes as its float32 columns)."""
        if self.kind == "composite":
            return torch.cat([self._as_columns(part, part.mode(p)) for part, p, _, _ in self._by_part(params)], -1)
        if self.kind == "multi_binary":
            return (params > 0).long()
        if self.kind == "continuous":
            return params
        best = [logits.argmax(-1) for logits in self._split(params)]
        return best[0] if self.kind == "discrete" else torch.stack(best, dim=-1)
