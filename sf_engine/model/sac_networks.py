"""SAC's networks (--algo sac): the squashed Gaussian actor, the acting model, and the twin critics the learner
trains beside it (Haarnoja et al. 2018).

The actor runs in the policy worker (sampling), the learner (training), the evaluator, enjoy.py and export (its
mean, squashed: greedy). It offers what the acting side asks of any model (sf_engine.algo.acting.build_policy):
forward / outputs -> (distribution parameters [B, 2A]: the Gaussian's means, then its log-stds; values [B], 0:
SAC's actor has no value), sample, distribution.mode, no recurrent core. Actions are in the env's bounds: tanh of
the Gaussian sample, scaled from [-1, 1] to [low, high] (the critics see them scaled back to [-1, 1]).
Observations: one or more vector keys (key -> [B, *shape]), flattened and, with --normalize_input, normalized by
the actor's running statistics, which the critics share. With a user's encoder (sf_engine.model.encoders) the
actor and each critic have one of their own, which receives those inputs split back into entries (`UserFeatures`).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from sf_engine.envs.spec import ACTION_MASK_KEY
from sf_engine.model.acting import ActContext, ActOutput
from sf_engine.model.cnn import init_layer
from sf_engine.model.encoders import is_builtin
from sf_engine.model.features import Encoder, RunningMeanStd, rows_of
from sf_engine.model.kernels import mlp

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # the actor's log-std is clamped here (Stable-Baselines3's bounds)


def vector_size(spec) -> int:
    """Values per observation over the vector keys (the action mask is not an input)."""
    return sum(int(math.prod(shape)) for key, shape, _ in spec.obs if key != ACTION_MASK_KEY)


class UserFeatures(Encoder):
    """A user's encoder over SAC's inputs x [B, in_size] (the vector entries side by side, already normalized with
    --normalize_input): x split back into its entries, float32 [B, *shape], through the engine's Encoder (which gives
    the user's module a dict of them for a Dict observation, the tensor alone for a Box one) -> features
    [B, out_size]."""

    def __init__(self, spec, mcfg):
        super().__init__(spec, dataclasses.replace(mcfg, normalize_input=False))  # x comes normalized
        self.sizes = [int(math.prod(self.shapes[key])) for key in self.keys]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(dict(zip(self.keys, x.split(self.sizes, dim=1))))


class MLPStack(nn.Module):
    """Linear layers of `hidden_size` units with `activation` after each but the last (its output), as torch ops:
    for SAC's 256-unit layers at batch 256 torch's own matrix products are faster than the compiled MLP kernels
    (perf/sac_updates.py: 108 against 92 updates/s on one thread, 192 against 124 on two, where the kernels run
    on one)."""

    def __init__(self, in_size: int, hidden_size: int, layers: int, activation: str, out_size: int, gain: float):
        super().__init__()
        sizes = [in_size] + [hidden_size] * layers
        hidden = [init_layer(nn.Linear(a, b), math.sqrt(2)) for a, b in zip(sizes, sizes[1:])]
        self.layers = nn.ModuleList(hidden + [init_layer(nn.Linear(sizes[-1], out_size), gain)])
        self.activations = (activation,) * layers + ("identity",)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mlp(x, list(self.layers), self.activations, kernels=False)


class SquashedGaussian:
    """The actor's distribution over parameters [B, 2A] (means, log-stds): a = tanh(mean + std * noise), scaled
    to the env's bounds. `mode` is the greedy action: the squashed mean."""

    kind = "continuous"

    def __init__(self, action_spec):
        self.size = action_spec.shape[0]
        self.num_params = 2 * self.size
        low = torch.tensor(action_spec.low, dtype=torch.float32)
        high = torch.tensor(action_spec.high, dtype=torch.float32)
        self.center, self.half_range = (high + low) / 2, (high - low) / 2

    def scale(self, squashed: torch.Tensor) -> torch.Tensor:
        """[-1, 1] -> the env's [low, high]."""
        return squashed * self.half_range.to(squashed.device) + self.center.to(squashed.device)

    def unscale(self, actions: torch.Tensor) -> torch.Tensor:
        """The env's [low, high] -> [-1, 1] (what the critics see)."""
        return (actions - self.center.to(actions.device)) / self.half_range.to(actions.device)

    def split(self, params: torch.Tensor):
        mean, log_std = params.split(self.size, dim=-1)
        return mean, log_std

    def rsample(self, params: torch.Tensor):
        """(squashed actions [B, A] in [-1, 1], their log-probabilities [B]), differentiable in `params` (the
        reparameterization trick; the tanh's change of variables in its stable form)."""
        mean, log_std = self.split(params)
        noise = torch.randn_like(mean)
        u = mean + log_std.exp() * noise
        gaussian = (-0.5 * noise.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        correction = (2.0 * (math.log(2.0) - u - nn.functional.softplus(-2.0 * u))).sum(-1)  # log(1 - tanh(u)^2)
        return torch.tanh(u), gaussian - correction

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        return self.scale(torch.tanh(self.split(params)[0]))


class SACActor(nn.Module):
    """The acting model of --algo sac: MLP -> (means, log-stds) of a tanh-squashed Gaussian per action dimension."""

    recurrent = False
    state_size = 0

    def __init__(self, spec, mcfg, bf16: bool = False, random_before_learning: bool = False):
        """`mcfg`: a resolved ModelConfig (hidden_size, mlp_layers, activation, normalize_input);
        `random_before_learning`: acting for training, uniform actions until the learner's first update (act)."""
        super().__init__()
        if spec.action.kind != "continuous":
            raise ValueError("SAC's actor needs a Box action space")
        self.random_before_learning = random_before_learning
        self.keys = [key for key, _, _ in spec.obs if key != ACTION_MASK_KEY]
        self.in_size = vector_size(spec)
        self.normalizer = RunningMeanStd((self.in_size,)) if mcfg.normalize_input else None
        self.distribution = SquashedGaussian(spec.action)
        self.encoder = None if is_builtin(mcfg.encoder) else UserFeatures(spec, mcfg)  # built-in: the MLP alone
        features = self.in_size if self.encoder is None else self.encoder.out_size
        self.net = MLPStack(
            features, mcfg.hidden_size, mcfg.mlp_layers, mcfg.activation, self.distribution.num_params, 0.01
        )

    def initial_state(self, batch: int, device="cpu"):
        return None

    def refresh_bf16_acting(self) -> None:
        """Nothing to prepare: SAC's small MLPs run in float32."""

    def _flat(self, obs: dict) -> torch.Tensor:
        """[B, in_size] float32: the vector keys flattened side by side."""
        parts = [rows_of(obs[key]).float() for key in self.keys]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def inputs(self, obs: dict) -> torch.Tensor:
        """[B, in_size] float32: the flattened observations, normalized with --normalize_input."""
        x = self._flat(obs)
        return self.normalizer.normalize(x) if self.normalizer is not None else x

    def params_of(self, x: torch.Tensor) -> torch.Tensor:
        """Distribution parameters [B, 2A] of inputs `x` (log-stds clamped)."""
        mean, log_std = self.distribution.split(self.net(x if self.encoder is None else self.encoder(x)))
        return torch.cat([mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)], dim=-1)

    def forward(self, obs: dict, state=None):
        params = self.params_of(self.inputs(obs))
        return params, params.new_zeros(params.shape[0])

    def outputs(self, obs: dict, state=None):
        return (*self(obs), None)

    def sample(self, obs: dict, state=None, forward=None, uniform: bool = False):
        """Acting: (actions [B, A] in the env's bounds, their log-probabilities [B], zeros [B], None); `forward`
        as ActorCritic.sample's. `uniform`: actions drawn uniformly within the bounds instead, without the
        forward pass (--random_before_learning), their log-probabilities those of the uniform on [-1, 1]^A."""
        if uniform:
            first = next(iter(obs.values()))
            squashed = torch.rand(first.shape[0], self.distribution.size, device=first.device) * 2 - 1
            zeros = squashed.new_zeros(first.shape[0])
            return self.distribution.scale(squashed), zeros - self.distribution.size * math.log(2.0), zeros, None
        params, values, _ = (forward or self.outputs)(obs, state)
        squashed, log_probs = self.distribution.rsample(params)
        return self.distribution.scale(squashed), log_probs, values, None

    def act(self, obs: dict, state, ctx: ActContext, forward=None) -> ActOutput:
        """The acting contract (sf_engine.model.acting): samples of the squashed Gaussian (TD3: its action with
        Gaussian noise), or with `ctx.greedy` the greedy action; uniform actions within the bounds while acting for
        training before the learner's first update (`ctx.version` 0) where `random_before_learning`."""
        if ctx.greedy:
            actions, values = self.greedy(obs)
            return ActOutput(actions, torch.zeros_like(values), values, None)
        uniform = self.random_before_learning and ctx.training and ctx.version <= 0
        return ActOutput(*self.sample(obs, state, forward, uniform=uniform))

    def greedy(self, obs: dict):
        """(the squashed mean in the env's bounds [B, A], zeros [B]): export's function."""
        params, values = self(obs)
        return self.distribution.mode(params), values

    @torch.no_grad()
    def update_normalizer(self, obs: dict) -> None:
        """With --normalize_input: merge the observations `obs` (key -> [N, *shape], tensors or NumPy arrays: the
        steps the replay buffer took in) into the running statistics."""
        if self.normalizer is not None:
            device = self.normalizer.mean.device
            self.normalizer.update(self._flat({key: torch.as_tensor(rows, device=device) for key, rows in obs.items()}))


class TwinCritic(nn.Module):
    """Two Q-networks Q1, Q2 over (inputs, action in [-1, 1]): the learner's, never published. Their layers are
    stacked ([2, in, out] weights) and run as one batched product per layer: half the ops of two separate
    networks, which on two threads means half the waits at each op's end while other processes of the run
    take a core (the same maths). With a user's encoder each has its own before its layers."""

    def __init__(self, spec, mcfg):
        """The critics of SAC's actor for the env of `spec` (its inputs, as SACActor.inputs gives them)."""
        super().__init__()
        action_size = spec.action.shape[0]
        encoders = None if is_builtin(mcfg.encoder) else [UserFeatures(spec, mcfg) for _ in range(2)]
        in_size = vector_size(spec) if encoders is None else encoders[0].out_size
        sizes = [in_size + action_size] + [mcfg.hidden_size] * mcfg.mlp_layers + [1]
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
            gain = 1.0 if i == len(sizes) - 2 else math.sqrt(2)
            pair = [init_layer(nn.Linear(a, b), gain) for _ in range(2)]
            self.weights.append(nn.Parameter(torch.stack([layer.weight.detach().t() for layer in pair])))
            self.biases.append(nn.Parameter(torch.stack([layer.bias.detach().unsqueeze(0) for layer in pair])))
        self.activation = torch.relu if mcfg.activation == "relu" else torch.tanh
        self.encoders = None if encoders is None else nn.ModuleList(encoders)

    def forward(self, x: torch.Tensor, squashed: torch.Tensor):
        """(Q1 [B], Q2 [B]) of inputs `x` [B, in_size] and actions `squashed` [B, A] in [-1, 1]."""
        if self.encoders is None:
            h = torch.cat([x, squashed], dim=1).unsqueeze(0).expand(2, -1, -1)
        else:
            h = torch.stack([torch.cat([encoder(x), squashed], dim=1) for encoder in self.encoders])
        last = len(self.weights) - 1
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            h = torch.baddbmm(bias, h, weight)
            h = self.activation(h) if i < last else h
        return h[0, :, 0], h[1, :, 0]

    def loss(self, x: torch.Tensor, squashed: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> tuple:
        """The critics' loss toward `targets` [B] (0.5 x the squared errors of both, weighted by `weights`, its
        mean), Q1's mean and |TD error| [B] (the mean of the two critics'): SAC's and TD3's critic step."""
        q1, q2 = self(x, squashed)
        error1, error2 = q1 - targets, q2 - targets
        loss = 0.5 * (weights * (error1.square() + error2.square())).mean()
        return loss, q1.detach().mean(), 0.5 * (error1.detach().abs() + error2.detach().abs())
