"""TD3's acting model: a deterministic actor, tanh-squashed into the env's bounds, which explores with Gaussian
noise added to its action (--exploration_noise of the half range). It offers what every acting site asks of a
model (outputs, sample, distribution.mode, greedy: sf_engine.model.sac_networks.SACActor's inputs, normalizer and
encoder, whose vector inputs it shares). Runs in the learner, policy worker, evaluator, enjoy.py and export.
"""

from __future__ import annotations

import torch

from sf_engine.model.sac_networks import MLPStack, SACActor, SquashedGaussian


class Deterministic:
    """The actor's policy as the acting sites see a distribution: parameters [B, A] before the tanh; `mode`, the
    greedy action, is their tanh scaled to the env's bounds; `explore` adds Gaussian noise of std `noise` (of the
    half range) to the squashed action and clips it to the bounds."""

    kind = "continuous"

    def __init__(self, action_spec, noise: float):
        self.bounds = SquashedGaussian(action_spec)  # its scale / unscale between [-1, 1] and the env's bounds
        self.size = self.num_params = action_spec.shape[0]
        self.noise = noise

    def scale(self, squashed: torch.Tensor) -> torch.Tensor:
        return self.bounds.scale(squashed)

    def unscale(self, actions: torch.Tensor) -> torch.Tensor:
        return self.bounds.unscale(actions)

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        return self.scale(torch.tanh(params))

    def explore(self, params: torch.Tensor) -> torch.Tensor:
        squashed = torch.tanh(params)
        return self.scale((squashed + self.noise * torch.randn_like(squashed)).clamp(-1.0, 1.0))


class TD3Actor(SACActor):
    """The acting model of --algo td3: SAC's inputs (the vector entries flattened, normalized with
    --normalize_input, through a user's encoder where one is given), an MLP, one output per action dimension."""

    def __init__(self, spec, cfg, bf16: bool = False):
        """`cfg`: the resolved Config (the model's flags, --exploration_noise and --random_before_learning)."""
        super().__init__(spec, cfg.model, bf16, cfg.replay.random_before_learning)
        self.distribution = Deterministic(spec.action, cfg.td3.exploration_noise)
        mcfg = cfg.model
        features = self.net.layers[0].in_features
        self.net = MLPStack(features, mcfg.hidden_size, mcfg.mlp_layers, mcfg.activation, self.distribution.size, 1.0)

    def params_of(self, x: torch.Tensor) -> torch.Tensor:
        """[B, A]: the actions before the tanh, of inputs `x`."""
        return self.net(x if self.encoder is None else self.encoder(x))

    def squashed(self, x: torch.Tensor) -> torch.Tensor:
        """[B, A] in [-1, 1]: the actions of inputs `x` as the critics see them."""
        return torch.tanh(self.params_of(x))

    def sample(self, obs: dict, state=None, forward=None, uniform: bool = False):
        """Acting: (actions [B, A] in the env's bounds with exploration noise, zeros [B], zeros [B], None); `uniform`:
        drawn uniformly within the bounds instead (acting before learning starts)."""
        if uniform:
            first = next(iter(obs.values()))
            squashed = torch.rand(first.shape[0], self.distribution.size, device=first.device) * 2.0 - 1.0
            zeros = squashed.new_zeros(first.shape[0])
            return self.distribution.scale(squashed), zeros, zeros, None
        params, values, _ = (forward or self.outputs)(obs, state)
        return self.distribution.explore(params), values, values, None
