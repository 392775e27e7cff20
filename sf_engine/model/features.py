"""Observations to features: the `Encoder` every model runs first, over the encoder that --encoder names
(sf_engine.model.encoders): a built-in one's MLP or CNN per observation entry, or a user's module over all of
them. What they share lives here: the input preparation (uint8 images to float in [0, 1] on the device, vectors
flattened) and the running normalizers of --normalize_input.

Runs in the learner, the policy worker, the evaluator, the replaying process and the export command.
"""

from __future__ import annotations

import copy
import math
from typing import Callable

import torch
from torch import nn

from sf_engine.envs.spec import ACTION_MASK_KEY, is_image
from sf_engine.model import kernels
from sf_engine.model.cnn import init_layer as _init
from sf_engine.model.encoders import BuiltinEncoder, encoder_factory, user_network
from sf_engine.model.kernels import Tanh, mlp

_ACTIVATIONS = {"tanh": Tanh, "relu": nn.ReLU}


def rows_of(x: torch.Tensor) -> torch.Tensor:
    """x [N, *shape] as [N, prod(shape)], also with no rows (a learner rank's empty share); N stays a traced size
    (export)."""
    return x.flatten(1) if x.dim() > 1 else x.unsqueeze(1)


class RunningMeanStd(nn.Module):
    """Running mean/variance (Chan et al. parallel merge). Buffers, so they travel with the weights."""

    def __init__(self, shape: tuple):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.full((), 1e-4))
        # several learner ranks (sf_engine.runtime.ranks.RankGroup.gather): every rank's batch statistics, merged in
        # rank order on every rank, so that the ranks' statistics stay the same; None: one learner
        self.gather: Callable[[torch.Tensor], torch.Tensor] | None = None

    @torch.no_grad()
    def update(self, batch: torch.Tensor) -> None:
        """Merge the statistics of `batch` [N, *shape] (learner only; with several ranks, those of every rank's)."""
        batch = batch.float()
        n = batch.shape[0]
        if n:
            batch_mean = batch.mean(0)
            batch_var = (batch - batch_mean).square_().mean(0)  # two passes: a third of torch's var(0) on images
        else:  # a rank without samples still takes part in the gather
            batch_mean, batch_var = torch.zeros_like(self.mean), torch.zeros_like(self.var)
        if self.gather is None:
            self._merge(n, batch_mean, batch_var)
            return
        size = self.mean.numel()
        rows = self.gather(torch.cat([batch.new_full((1,), n), batch_mean.reshape(-1), batch_var.reshape(-1)]))
        for row in rows.to(self.mean.device):
            self._merge(int(row[0]), row[1 : 1 + size].view_as(self.mean), row[1 + size :].view_as(self.var))

    def _merge(self, n: int, batch_mean: torch.Tensor, batch_var: torch.Tensor) -> None:
        if not n:
            return
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean += delta * n / total
        self.var.copy_((self.var * self.count + batch_var * n + delta.pow(2) * self.count * n / total) / total)
        self.count.copy_(total)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / torch.sqrt(self.var + 1e-8)).clamp(-10.0, 10.0)

    def image_affine(self):
        """(scale, shift) with raw * scale + shift = (raw / 255 - mean) / std, statistics kept in [0, 1]."""
        inv_std = torch.rsqrt(self.var + 1e-5)
        return inv_std / 255.0, -self.mean * inv_std


class MLP(nn.Module):
    """`layers` linear layers of `hidden_size` units, each followed by the activation, run by kernels.mlp (one
    compiled forward and backward on the CPU) rather than module by module: a module call costs several
    us of Python, a large part of acting on a small batch. The parameters keep the nn.Sequential names
    (net.0.weight, ...)."""

    def __init__(self, in_size: int, hidden_size: int, layers: int, activation: str, layer_norm: bool = False):
        super().__init__()
        modules, size = [], in_size
        for _ in range(layers):
            norm = [nn.LayerNorm(hidden_size)] if layer_norm else []  # PQN's: before the nonlinearity
            modules += [_init(nn.Linear(size, hidden_size), math.sqrt(2)), *norm, _ACTIVATIONS[activation]()]
            size = hidden_size
        self.net = nn.Sequential(*modules)
        self.linears = [module for module in modules if isinstance(module, nn.Linear)]
        self.norms = [module for module in modules if isinstance(module, nn.LayerNorm)] or None
        self.activations = (activation,) * layers
        self.out_size = size

    def forward(self, x):
        return mlp(x, self.linears, self.activations, norms=self.norms)

    def with_head(self, head: nn.Linear) -> tuple:
        """(linears, activations, norms) of this MLP, then `head` (no activation or norm): one kernels.mlp stack."""
        norms = None if self.norms is None else self.norms + [None]
        return self.linears + [head], self.activations + ("identity",), norms


class EmbeddedMLP(nn.Module):
    """A Dict observation's Discrete parts as rows of a table (--discrete_obs embed: envs.observations): each
    dimension's row of a learned embedding of `hidden_size` columns, concatenated, through the activation, then the
    rest of an MLP's layers. The table is the first layer of the one-hot's MLP, looked up instead of multiplied."""

    def __init__(self, rows: int, dims: int, hidden_size: int, layers: int, activation: str, layer_norm: bool = False):
        super().__init__()
        self.table = nn.Embedding(rows, hidden_size)
        nn.init.normal_(self.table.weight, std=1.0)
        self.norm = nn.LayerNorm(dims * hidden_size) if layer_norm else None
        self.activation = _ACTIVATIONS[activation]()
        self.rest = MLP(dims * hidden_size, hidden_size, layers - 1, activation, layer_norm) if layers > 1 else None
        self.out_size = hidden_size if layers > 1 else dims * hidden_size

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        x = self.table(rows.long()).flatten(1)
        x = self.activation(x if self.norm is None else self.norm(x))
        return x if self.rest is None else self.rest(x)


def _channels_first(shape: tuple) -> bool:
    """Images come as [C, H, W] (EnvPool) or [H, W, C] (most Gymnasium envs, C in 1..4)."""
    return not (shape[-1] <= 4 < shape[0])


class Encoder(nn.Module):
    """Observations (a dict key -> [B, *shape] in their stored dtype; the action mask is never an input: it masks
    the policy's logits) -> features [B, out_size]. A built-in encoder: one MLP per vector entry and one CNN per
    image entry (or an MLP, under --encoder mlp), concatenated. A user's: its module over all entries, which
    receives what `user_inputs` says."""

    def __init__(self, spec, mcfg, layer_norm: bool = False, networks: bool = True):
        """`mcfg`: a resolved ModelConfig; `layer_norm`: a built-in encoder's LayerNorm after each hidden layer
        (each convolution and linear layer: PQN's). Without `networks`, the inputs of a user's whole network
        (--model, sf_engine.model.user_model): `user_inputs` and the normalizers, no network of its own."""
        super().__init__()
        factory = encoder_factory(mcfg.encoder) if networks else None
        builtin = factory if isinstance(factory, BuiltinEncoder) else None
        self.keys, self.image_keys, self.hwc_keys, self.shapes = [], set(), set(), {}
        tables = spec.layout.index_tables() if spec.layout is not None else {}  # --discrete_obs embed
        self.nets = nn.ModuleDict()  # a built-in encoder's, per entry
        self.normalizers = nn.ModuleDict()
        for key, shape, dtype in spec.obs:
            if key == ACTION_MASK_KEY:
                continue
            self.keys.append(key)
            self.shapes[key] = shape
            if is_image(shape, dtype) and (builtin is None or builtin.cnn is not None):
                self.image_keys.add(key)
                if not _channels_first(shape):
                    self.hwc_keys.add(key)
                    shape = (shape[2], shape[0], shape[1])
                if builtin is not None:
                    self.nets[key] = builtin.image_network(shape, layer_norm).to(memory_format=torch.channels_last)
                if mcfg.normalize_input:  # per pixel and channel, as Sample Factory does, in [H, W, C] rows
                    self.normalizers[key] = RunningMeanStd((shape[1], shape[2], shape[0]))
            elif key in tables:
                if builtin is not None:
                    self.nets[key] = EmbeddedMLP(
                        tables[key], shape[0], mcfg.hidden_size, mcfg.mlp_layers, mcfg.activation, layer_norm
                    )
            else:
                size = int(math.prod(shape))
                if builtin is not None:
                    self.nets[key] = MLP(size, mcfg.hidden_size, mcfg.mlp_layers, mcfg.activation, layer_norm)
                if mcfg.normalize_input and dtype != "uint8":
                    self.normalizers[key] = RunningMeanStd((size,))
        self.is_dict = spec.is_dict  # a user's module takes a dict, or the tensor of a plain Box observation
        self.user, self.out_size = None, 0
        if builtin is not None:
            self.out_size = sum(net.out_size for net in self.nets.values())
        elif networks:
            self.user, self.out_size = user_network(mcfg.encoder, spec)

    @property
    def bf16_copies(self) -> bool:
        """Whether acting under --bf16 runs bfloat16 copies of this encoder's networks (bfloat16_nets): a built-in
        encoder's CNNs. A user's module runs under autocast instead."""
        return self.user is None and bool(self.image_keys)

    @property
    def single_mlp(self):
        """(key, MLP) when the encoder is one MLP over one vector observation, else None."""
        if len(self.keys) == 1 and self.keys[0] in self.nets and isinstance(self.nets[self.keys[0]], MLP):
            return self.keys[0], self.nets[self.keys[0]]
        return None

    def prepare(self, key: str, x: torch.Tensor, bf16: bool = False) -> torch.Tensor:
        """Stored dtype -> network input: images to float in [0, 1] (channels-last; bfloat16 under
        --bf16's autocast or if `bf16`), vectors flattened and normalized (rows of a table as they are)."""
        if key in self.image_keys:  # to channels-last while still uint8 (a quarter of the bytes of float)
            rows = x if key in self.hwc_keys else x.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
            bf16 = bf16 or torch.is_autocast_enabled(x.device.type)  # --bf16: straight to the conv's dtype
            scale, shift = self.normalizers[key].image_affine() if key in self.normalizers else (None, None)
            fused = kernels.image_affine(rows, scale, shift, bf16)  # the compiled kernel's one pass, on the CPU
            if fused is not None:
                return fused.permute(0, 3, 1, 2)
            # converted as contiguous [B, H, W, C] rows (torch's CPU conversion of a channels-last view
            # takes its slow strided path), then seen as [B, C, H, W] in channels-last
            rows = rows.to(torch.bfloat16 if bf16 else torch.float32)
            if scale is not None:  # (x / 255 - mean) / std in two passes, clipped to 5 std
                return rows.mul_(scale.to(rows.dtype)).add_(shift.to(rows.dtype)).clamp_(-5.0, 5.0).permute(0, 3, 1, 2)
            return rows.div_(255.0).permute(0, 3, 1, 2)
        if x.dtype == torch.uint8:
            return x.reshape(x.shape[0], -1).float().div_(255.0)
        x = x.reshape(x.shape[0], -1).float()
        return self.normalizers[key].normalize(x) if key in self.normalizers else x

    def update_normalizers(self, obs: dict) -> None:
        """With --normalize_input: merge the observations `obs` (key -> [N, *shape]) into each entry's running
        statistics (learner only)."""
        for key, normalizer in self.normalizers.items():
            if key in self.image_keys:  # [B, H, W, C] uint8: a quarter of the rows, in [0, 1]
                normalizer.update(obs[key][::4].float().div_(255.0))
            else:
                normalizer.update(rows_of(obs[key]))

    def user_inputs(self, obs: dict):
        """What a user's module receives: per entry a contiguous float32 tensor [B, *shape], shaped as the env
        gives it (images [B, C, H, W] or [B, H, W, C] alike), uint8 entries scaled to [0, 1], images normalized
        per pixel and channel and vectors per entry with --normalize_input; a dict of them for a Dict
        observation, the tensor alone for a Box one."""
        inputs = {}
        for key in self.keys:
            x = self.prepare(key, obs[key])
            if key in self.image_keys:  # prepare's [B, C, H, W] is channels-last in memory: a module may view it
                x = x.permute(0, 2, 3, 1) if key in self.hwc_keys else x.contiguous()
            else:
                x = x.reshape(x.shape[0], *self.shapes[key])
            inputs[key] = x.float()  # bfloat16 images under --bf16's autocast: the module is given float32
        return inputs if self.is_dict else inputs[self.keys[0]]

    def forward(self, obs: dict, bf16_nets: nn.ModuleDict = None) -> torch.Tensor:
        """Features [B, out_size]; with `bf16_nets` (bfloat16_nets()) its image networks run in bfloat16."""
        if self.user is not None:
            return self.user(self.user_inputs(obs))
        nets = self.nets if bf16_nets is None else bf16_nets
        bf16 = bf16_nets is not None
        if len(self.keys) == 1:
            key = self.keys[0]
            return nets[key](self.prepare(key, obs[key], bf16))
        return torch.cat(
            [nets[key](self.prepare(key, obs[key], bf16 and key in self.image_keys)) for key in self.keys], dim=1
        )

    def bfloat16_nets(self, copies: nn.ModuleDict = None) -> nn.ModuleDict:
        """The networks with bfloat16 copies of the image networks (the others as they are): made, or
        `copies` refreshed from the current weights."""
        if copies is None:
            return nn.ModuleDict(
                {
                    key: copy.deepcopy(net).to(torch.bfloat16) if key in self.image_keys else net
                    for key, net in self.nets.items()
                }
            )
        with torch.no_grad():
            for key in self.image_keys:
                for target, source in zip(copies[key].parameters(), self.nets[key].parameters()):
                    target.copy_(source)
        return copies
