"""CrossQ (Bhatt, Palenicek, Belousov, Argus, Amiranashvili, Brox and Peters, ICLR 2024): soft actor-critic without
target networks. Batch renormalization (Ioffe 2017) in the critics and the actor; the critics see the replayed steps
and their next steps in one batch, so that its statistics are of both, and the targets are the next steps' half of
that forward, detached. The actor and the temperature move every --policy_delay critic updates; Adam with beta1 0.5.
Written against sf_engine's public API and moved here unchanged but for its imports. Runs in the learner process
(CrossQ) and every process that acts (Actor).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from sf_engine.algo.base import CompiledLosses, TrainResult, schedule_learning_rate
from sf_engine.algo.training_state import Holds, TrainingState
from sf_engine.model.acting import ActOutput
from sf_engine.model.encoders import is_builtin
from sf_engine.model.features import Encoder
from sf_engine.model.flat_state import FlatAdam, flatten_state

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
LOSS_STATS = ("critic_loss", "actor_loss", "alpha", "entropy", "q_mean", "td_abs_mean")


class BatchRenorm(nn.Module):
    """Batch renormalization over the rows of [..., B, F] (a stack of S networks' batches: statistics [S, F] each
    its own; or [B, F]): with `batch_stats` the batch's mean and variance, corrected toward the running ones by r and
    d (clipped, no gradient; 1 and 0 during the warm-up updates), the running ones moved by `momentum`; without, the
    running ones. Its statistics and step count are floating buffers (the flat state the learner publishes holds
    them)."""

    def __init__(
        self,
        shape: tuple,
        momentum: float,
        warmup_steps: int,
        r_max: float,
        d_max: float,
        eps=1e-3,
    ):
        super().__init__()
        self.weight, self.bias = (
            nn.Parameter(torch.ones(shape)),
            nn.Parameter(torch.zeros(shape)),
        )
        self.register_buffer("running_mean", torch.zeros(shape))
        self.register_buffer("running_var", torch.ones(shape))
        self.register_buffer("steps", torch.zeros(()))
        self.momentum, self.warmup_steps, self.r_max, self.d_max, self.eps = (
            momentum,
            warmup_steps,
            r_max,
            d_max,
            eps,
        )

    def forward(self, x: torch.Tensor, batch_stats: bool) -> torch.Tensor:
        """weight x (x - mean) / std (x r + d) + bias, written as one scale and one shift per feature over the centred
        rows (the same function and gradient, a third of the passes over [..., B, F])."""
        row = lambda stat: stat.unsqueeze(-2)  # noqa: E731  [..., F] -> [..., 1, F]
        running_std = (self.running_var + self.eps).sqrt()
        if not batch_stats:
            scale = self.weight / running_std
            return torch.addcmul(row(self.bias - self.running_mean * scale), x, row(scale))
        mean = x.mean(dim=-2)
        centered = x - row(mean)
        var = centered.square().mean(dim=-2)
        std = (var + self.eps).sqrt()
        # after the warm-up r and d, before it 1 and 0: a tensor's choice, not Python's (torch.compile fuses it whole)
        warm = self.steps >= self.warmup_steps
        r = torch.where(warm, (std.detach() / running_std).clamp(1.0 / self.r_max, self.r_max), 1.0)
        d = torch.where(warm, ((mean.detach() - self.running_mean) / running_std).clamp(-self.d_max, self.d_max), 0.0)
        scale, shift = self.weight * r / std, self.weight * d + self.bias
        with torch.no_grad():
            self.running_mean.lerp_(mean.detach(), self.momentum)
            self.running_var.lerp_(var.detach(), self.momentum)
            self.steps.add_(1.0)
        return torch.addcmul(row(shift), centered, row(scale))


class RenormMLP(nn.Module):
    """`stack` networks side by side (their layers stacked, [S, in, out] weights, one batched product per layer), each
    linear layers of `hidden` units followed by batch renormalization and ReLU, then the output layer; the input
    batch-renormalized too (CrossQ's). Takes [B, D] (every network the same rows) or [S, B, D]; returns [S, B, out]."""

    def __init__(
        self,
        in_size: int,
        hidden: int,
        layers: int,
        out_size: int,
        ccfg,
        stack: int = 1,
    ):
        super().__init__()
        renorm = lambda size: BatchRenorm(  # noqa: E731
            (stack, size),
            ccfg.renorm_momentum,
            ccfg.renorm_warmup_steps,
            ccfg.renorm_r_max,
            ccfg.renorm_d_max,
        )
        sizes = [in_size] + [hidden] * layers + [out_size]
        self.stack, self.input_norm = stack, renorm(in_size)
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        for a, b in zip(sizes, sizes[1:]):
            layers_ = [nn.Linear(a, b) for _ in range(stack)]  # torch's own initialization, each network its own
            self.weights.append(nn.Parameter(torch.stack([layer.weight.detach().t() for layer in layers_])))
            self.biases.append(nn.Parameter(torch.stack([layer.bias.detach().unsqueeze(0) for layer in layers_])))
        self.norms = nn.ModuleList(renorm(size) for size in sizes[1:-1])

    def forward(self, x: torch.Tensor, batch_stats: bool) -> torch.Tensor:
        x = x.expand(self.stack, *x.shape) if x.dim() == 2 else x
        x = self.input_norm(x, batch_stats)
        last = len(self.weights) - 1
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(bias, x, weight)
            if i < last:
                x = torch.relu(self.norms[i](x, batch_stats))
        return x


def _squashed_sample(mean: torch.Tensor, log_std: torch.Tensor):
    """(tanh(u) [B, A] for u ~ N(mean, exp(log_std)), its log-probability [B] with the tanh's correction)."""
    noise = torch.randn_like(mean)
    u = mean + log_std.exp() * noise
    gaussian = (-0.5 * noise.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    correction = (2.0 * (math.log(2.0) - u - nn.functional.softplus(-2.0 * u))).sum(-1)  # log(1 - tanh(u)^2)
    return torch.tanh(u), gaussian - correction


def _flat(spec, obs: dict) -> torch.Tensor:
    """[B, D] float32: the vector entries side by side."""
    parts = [obs[key].reshape(obs[key].shape[0], -1).float() for key, _, _ in spec.obs]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


class Inputs(nn.Module):
    """What a network of CrossQ's sees of the observations: their vector entries side by side (its own input
    normalization is the batch renormalization), or with a user's --encoder that encoder's features (the engine's
    Encoder wires it, as for every algorithm)."""

    def __init__(self, spec, cfg):
        super().__init__()
        self.spec = spec
        self.encoder = None if is_builtin(cfg.model.encoder) else Encoder(spec, cfg.model)  # built-in: the entries
        self.size = self.encoder.out_size if self.encoder is not None else sum(math.prod(s) for _, s, _ in spec.obs)

    def forward(self, obs: dict) -> torch.Tensor:
        return _flat(self.spec, obs) if self.encoder is None else self.encoder(obs)


class Actor(nn.Module):
    """A tanh-squashed Gaussian over the env's Box bounds, its MLP batch-renormalized. Its acting contract
    (sf_engine.ActingNetwork): the running statistics (never a batch's), samples (uniform within the bounds while
    acting for training before the learner's first update, --random_before_learning), or the squashed mean greedily."""

    recurrent = False
    state_size = 0

    def __init__(self, spec, cfg, bf16: bool = False):
        super().__init__()
        self.spec, self.random_before_learning = spec, cfg.replay.random_before_learning
        self.size = spec.action.shape[0]
        self.inputs = Inputs(spec, cfg)
        self.net = RenormMLP(
            self.inputs.size,
            cfg.model.hidden_size,
            cfg.model.mlp_layers,
            2 * self.size,
            cfg.crossq,
        )
        low, high = (torch.tensor(v, dtype=torch.float32) for v in (spec.action.low, spec.action.high))
        self.register_buffer("center", (high + low) / 2)
        self.register_buffer("half_range", (high - low) / 2)

    def initial_state(self, batch: int, device="cpu"):
        return None

    def refresh_bf16_acting(self) -> None:
        pass

    def params(self, x: torch.Tensor, batch_stats: bool):
        """(means, log-stds clamped) [B, A] of inputs x [B, D]."""
        mean, log_std = self.net(x, batch_stats)[0].chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def rsample(self, x: torch.Tensor, batch_stats: bool):
        """(squashed actions in [-1, 1] [B, A], their log-probabilities [B]) by the reparameterization trick."""
        return _squashed_sample(*self.params(x, batch_stats))

    def scale(self, squashed: torch.Tensor) -> torch.Tensor:
        return self.center + self.half_range * squashed

    def unscale(self, actions: torch.Tensor) -> torch.Tensor:
        return ((actions - self.center) / self.half_range).clamp(-1.0, 1.0)

    def outputs(self, obs: dict, state=None):
        mean, log_std = self.params(self.inputs(obs), batch_stats=False)
        return torch.cat([mean, log_std], dim=-1), mean.new_zeros(mean.shape[0]), None

    def act(self, obs: dict, state, ctx, forward=None):
        params, values, _ = (forward or self.outputs)(obs, state)
        mean, log_std = params.chunk(2, dim=-1)
        if ctx.greedy:
            return ActOutput(self.scale(torch.tanh(mean)), torch.zeros_like(values), values, None)
        if self.random_before_learning and ctx.training and ctx.version <= 0:
            squashed = torch.rand_like(mean) * 2.0 - 1.0
            return ActOutput(self.scale(squashed), values - self.size * math.log(2.0), values, None)
        squashed, log_probs = _squashed_sample(mean, log_std)
        return ActOutput(self.scale(squashed), log_probs, values, None)


class Critics(nn.Module):
    """Two Q-networks over (inputs, squashed action), batch-renormalized, --critic_hidden_size wide, stacked (each
    layer one batched product for both)."""

    def __init__(self, spec, cfg):
        super().__init__()
        self.inputs = Inputs(spec, cfg)  # with a user's encoder, one of the critics' own (both share it)
        self.net = RenormMLP(
            self.inputs.size + spec.action.shape[0],
            cfg.crossq.critic_hidden_size,
            cfg.model.mlp_layers,
            1,
            cfg.crossq,
            stack=2,
        )

    def forward(self, x: torch.Tensor, squashed: torch.Tensor, batch_stats: bool):
        """(Q1 [B], Q2 [B]) of inputs x [B, D] (its `inputs` of the observations) and actions `squashed` [B, A] in
        [-1, 1]."""
        q = self.net(torch.cat([x, squashed], dim=1), batch_stats)
        return q[0, :, 0], q[1, :, 0]


class CrossQ(TrainingState):
    """One policy's CrossQ (sf_engine.Algorithm): the actor (published), the twin critics, the temperature, each with
    its own Adam; no target networks."""

    holds = Holds(
        modules=("model", "critic"),
        optimizers={
            "actor": "optimizer",
            "critic": "critic_optimizer",
            "alpha": "alpha_optimizer",
        },
        optimizers_key="optimizers",
        tensors=("log_alpha",),
        counters=("num_updates",),
    )

    @staticmethod
    def acting_network(spec, cfg, bf16: bool = False) -> Actor:
        return Actor(spec, cfg, bf16)

    def __init__(self, cfg, spec, device, hooks):
        self.cfg, self.lcfg, self.ccfg, self.spec, self.device, self.hooks = (
            cfg,
            cfg.learner,
            cfg.crossq,
            spec,
            device,
            hooks,
        )
        self.model = Actor(spec, cfg).to(device)
        self.params = flatten_state(self.model)
        self.critic = Critics(spec, cfg).to(device)
        self.critic_params = flatten_state(self.critic)
        temperature = Temperature(self.ccfg.initial_alpha).to(device)
        lr, eps = self.lcfg.learning_rate, self.lcfg.adam_eps
        self.optimizer = FlatAdam(self.model, self.params, lr=lr, eps=eps)
        self.critic_optimizer = FlatAdam(self.critic, self.critic_params, lr=lr, eps=eps)
        self.alpha_optimizer = FlatAdam(temperature, flatten_state(temperature), lr=lr, eps=eps)
        for optimizer in (self.optimizer, self.critic_optimizer, self.alpha_optimizer):
            optimizer.param_groups[0]["betas"] = (self.ccfg.adam_beta1, 0.999)
        self.log_alpha = temperature.log_alpha  # a view into its optimizer's flat vector
        self.target_entropy = self.ccfg.target_entropy_per_dim * self.model.size
        self.num_updates = 0
        self.last_actor_loss, self.last_entropy = 0.0, 0.0
        self.statistics, self.average_statistics = [], None  # several ranks: join_ranks
        self.compile = CompiledLosses(cfg, device, hooks.beat)  # --compile: the critics' loss through torch.compile
        self.critic_loss = self.compile.compiled(self._critic_loss)

    @property
    def learning_rate(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def train(self, batch) -> TrainResult:
        """One step of the critics on a ReplayBatch, and every --policy_delay steps one of the actor and the
        temperature: its TrainResult, with |TD error| [B] as the priorities (the mean of the two critics'). A step
        whose loss or gradient is not finite is skipped whole."""
        if self.num_updates % 64 == 0:
            schedule_learning_rate(self.optimizer, self.cfg, self.lcfg, self.hooks)
            self._set_learning_rate(self.learning_rate)
        with self.compile.step():
            return self._update(batch)

    def _update(self, batch) -> TrainResult:
        x = self.model.inputs(batch.obs)
        with torch.no_grad():
            next_x = self.model.inputs(batch.next_obs)
        both = self.critic.inputs({key: torch.cat([batch.obs[key], batch.next_obs[key]]) for key in batch.obs})
        alpha = self.log_alpha.detach().exp()
        critic_loss, q_mean, td_abs = self.critic_loss(batch, both, next_x, alpha)
        td_abs = td_abs.clone()  # the priorities outlive this update (a compiled one's outputs may not)
        self.critic_optimizer.zero_grad()
        critic_loss.backward()
        norms = [self.critic_optimizer.clip_grad_norm(self.lcfg.max_grad_norm, critic_loss.detach())]
        delayed = self.num_updates % self.ccfg.policy_delay == 0
        if delayed:
            squashed, log_probs = self.model.rsample(x, batch_stats=True)
            self.critic.requires_grad_(False)
            q = self.critic(both[: len(x)].detach(), squashed, batch_stats=False)
            actor_loss = (alpha * log_probs - torch.minimum(*q)).mean()
            self.optimizer.zero_grad()
            actor_loss.backward()
            self.critic.requires_grad_(True)
            norms.append(self.optimizer.clip_grad_norm(self.lcfg.max_grad_norm, actor_loss.detach()))
        self._average_statistics()
        stats = torch.stack([critic_loss.detach(), q_mean, td_abs.mean(), *norms]).cpu()
        if not torch.isfinite(stats).all():
            return TrainResult(0, {}, 0, 1, torch.zeros_like(td_abs))
        self.critic_optimizer.step()
        if delayed:
            self.optimizer.step()
            self.alpha_optimizer.zero_grad()
            alpha_loss = -(self.log_alpha * (log_probs.detach() + self.target_entropy).mean())
            alpha_loss.backward()
            self.alpha_optimizer.step()
            self.last_actor_loss, self.last_entropy = actor_loss.item(), -log_probs.detach().mean().item()
        self.num_updates += 1
        figures = [float(stats[0]), self.last_actor_loss, float(alpha), self.last_entropy, *stats[1:3].tolist()]
        return TrainResult(
            len(x), dict(zip(LOSS_STATS, figures)) | {"grad_norm": float(stats[3:].norm())}, 1, 0, td_abs
        )

    def join_ranks(self, group) -> None:
        """Several learner ranks: besides the gradients' mean, the running statistics of every batch
        renormalization are averaged over the ranks after each update (the tail of the actor's and the critics' flat
        state: sf_engine.model.flat_state puts the buffers after the parameters). Each rank normalizes by its own
        batch's statistics, as data-parallel batch normalization does; its running ones stay the same on every
        rank."""
        super().join_ranks(group)
        self.statistics = [
            flat[sum(p.numel() for p in module.parameters()) :]
            for flat, module in ((self.params, self.model), (self.critic_params, self.critic))
        ]
        self.average_statistics = group.average_

    @torch.no_grad()
    def _average_statistics(self) -> None:
        """With ranks: the renormalizations' running statistics (moved by this update's batches) averaged, in one
        all-reduce."""
        if self.average_statistics is None:
            return
        both = self.average_statistics(torch.cat(self.statistics))
        offset = 0
        for tail in self.statistics:
            tail.copy_(both[offset : offset + tail.numel()])
            offset += tail.numel()

    def _critic_loss(self, batch, both: torch.Tensor, next_x: torch.Tensor, alpha: torch.Tensor) -> tuple:
        """The critics' loss (0.5 x both critics' squared errors, weighted by the importance weights), Q1's mean and
        |TD error| [B] (the mean of the two critics'): the replayed steps and their next steps (with the actor's next
        actions) in one batch-renormalized forward, so that its statistics are of both; the targets are the next
        steps' half, detached (no target networks)."""
        actions = self.model.unscale(batch.actions)
        with torch.no_grad():
            next_actions, next_log_probs = self.model.rsample(next_x, batch_stats=False)
        q1, q2 = self.critic(both, torch.cat([actions, next_actions]), batch_stats=True)
        size = len(next_x)
        next_q = torch.minimum(q1[size:], q2[size:]).detach() - alpha * next_log_probs
        targets = batch.returns + batch.discounts * next_q
        error1, error2 = q1[:size] - targets, q2[:size] - targets
        loss = 0.5 * (batch.weights * (error1.square() + error2.square())).mean()
        return loss, q1[:size].detach().mean(), 0.5 * (error1.detach().abs() + error2.detach().abs())


class Temperature(nn.Module):
    """The entropy temperature as log(alpha), one parameter."""

    def __init__(self, alpha: float):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(math.log(alpha)))
