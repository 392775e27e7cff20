"""Convolutional encoders of image observations: the Nature DQN CNN, Sample Factory's simple conv net
(its Doom agents'), a small 3x3 CNN for tiny images and the IMPALA residual CNN. Input [B, C, H, W] float.
With `layer_norm` (PQN's, as its paper and CleanRL's pqn_atari_envpool.py have it) a LayerNorm over [C, H, W]
follows each convolution, and one over the units the last linear layer, each before its nonlinearity.
The built-in encoders of sf_engine.model.encoders name them.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from sf_engine.model.kernels import ELU


def init_layer(layer: nn.Module, gain: float) -> nn.Module:
    """Orthogonal init as in the PPO literature (sqrt(2) hidden, 0.01 policy head, 1 value head), of a
    weight in any memory layout (a conv's, once the encoder is channels-last)."""
    with torch.no_grad():
        layer.weight.copy_(nn.init.orthogonal_(torch.empty(layer.weight.shape), gain))
        layer.bias.zero_()
    return layer


def conv_stack(layers: list, shape: tuple, layer_norm: bool) -> nn.Sequential:
    """`layers` then Flatten, with `layer_norm` a LayerNorm over [C, H, W] after each convolution (before the
    nonlinearity that follows it), its shape found by running a zero image of [C, H, W] `shape` through them."""
    if layer_norm:
        normed, x = [], torch.zeros(1, *shape)
        with torch.no_grad():
            for layer in layers:
                x = layer(x)
                normed += [layer, nn.LayerNorm(list(x.shape[1:]))] if isinstance(layer, nn.Conv2d) else [layer]
        layers = normed
    return nn.Sequential(*layers, nn.Flatten())


class _ConvEncoder(nn.Module):
    """`convs` (ending in Flatten), then one linear layer of `units` units (ReLU unless said)."""

    def __init__(self, convs: nn.Sequential, shape: tuple, units: int, activation=nn.ReLU, layer_norm: bool = False):
        super().__init__()
        self.convs = convs
        with torch.no_grad():
            size = self.convs(torch.zeros(1, *shape)).shape[1]
        norm = [nn.LayerNorm(units)] if layer_norm else []  # PQN's, before the nonlinearity
        self.fc = nn.Sequential(init_layer(nn.Linear(size, units), math.sqrt(2)), *norm, activation())
        self.out_size = units

    def forward(self, x):
        return self.fc(self.convs(x))


class NatureCNN(_ConvEncoder):
    """Mnih et al. 2015: 3 conv layers + 512-unit linear layer. Input [B, C, H, W] float in [0, 1]."""

    def __init__(self, shape: tuple, layer_norm: bool = False):
        convs = [
            init_layer(nn.Conv2d(shape[0], 32, 8, stride=4), math.sqrt(2)),
            nn.ReLU(),
            init_layer(nn.Conv2d(32, 64, 4, stride=2), math.sqrt(2)),
            nn.ReLU(),
            init_layer(nn.Conv2d(64, 64, 3, stride=1), math.sqrt(2)),
            nn.ReLU(),
        ]
        super().__init__(conv_stack(convs, shape, layer_norm), shape, 512, layer_norm=layer_norm)


class SimpleCNN(_ConvEncoder):
    """Sample Factory's default image encoder ('convnet_simple', used for its Doom agents): 32 8x8/4,
    64 4x4/2 and 128 3x3/2 convolutions, then 512 units, all ELU."""

    def __init__(self, shape: tuple, layer_norm: bool = False):
        convs = [
            init_layer(nn.Conv2d(shape[0], 32, 8, stride=4), math.sqrt(2)),
            ELU(),
            init_layer(nn.Conv2d(32, 64, 4, stride=2), math.sqrt(2)),
            ELU(),
            init_layer(nn.Conv2d(64, 128, 3, stride=2), math.sqrt(2)),
            ELU(),
        ]
        super().__init__(conv_stack(convs, shape, layer_norm), shape, 512, activation=ELU, layer_norm=layer_norm)


class SmallCNN(_ConvEncoder):
    """For images too small for the Nature CNN's 8x8/4 first layer (MiniGrid-style views): three 3x3
    convolutions at full resolution, then 256 units (ReLU)."""

    def __init__(self, shape: tuple, layer_norm: bool = False):
        convs = [
            init_layer(nn.Conv2d(shape[0], 16, 3, padding=1), math.sqrt(2)),
            nn.ReLU(),
            init_layer(nn.Conv2d(16, 32, 3, padding=1), math.sqrt(2)),
            nn.ReLU(),
            init_layer(nn.Conv2d(32, 32, 3, padding=1), math.sqrt(2)),
            nn.ReLU(),
        ]
        super().__init__(conv_stack(convs, shape, layer_norm), shape, 256, layer_norm=layer_norm)


class _ResidualBlock(nn.Module):
    """x + conv(relu(conv(relu(x)))), with `norm_shape` ([C, H, W]) a LayerNorm after each convolution."""

    def __init__(self, channels: int, norm_shape: list | None = None):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm0 = nn.LayerNorm(norm_shape) if norm_shape else nn.Identity()
        self.norm1 = nn.LayerNorm(norm_shape) if norm_shape else nn.Identity()

    def forward(self, x):
        return x + self.norm1(self.conv1(torch.relu(self.norm0(self.conv0(torch.relu(x))))))


class ImpalaCNN(_ConvEncoder):
    """Espeholt et al. 2018: 3 stages of conv + max-pool + 2 residual blocks, then 256 units (ReLU)."""

    def __init__(self, shape: tuple, depths=(16, 32, 32), layer_norm: bool = False):
        layers, x = [], torch.zeros(1, *shape)
        for depth in depths:
            conv = nn.Conv2d(x.shape[1], depth, 3, padding=1)
            with torch.no_grad():
                size = list(conv(x).shape[1:])
            stage = [conv, *([nn.LayerNorm(size)] if layer_norm else []), nn.MaxPool2d(3, stride=2, padding=1)]
            with torch.no_grad():
                x = nn.Sequential(*stage)(x)
            norm_shape = list(x.shape[1:]) if layer_norm else None
            layers += stage + [_ResidualBlock(depth, norm_shape), _ResidualBlock(depth, norm_shape)]
        super().__init__(nn.Sequential(*layers, nn.ReLU(), nn.Flatten()), shape, 256, layer_norm=layer_norm)


def nature_cnn(shape_chw: tuple, layer_norm: bool = False) -> nn.Module:
    """--encoder nature_cnn's CNN for images of [C, H, W] `shape_chw`: the Nature CNN, or the small one for
    images under 36 pixels, too small for its 8x8/4 first layer."""
    return (NatureCNN if min(shape_chw[1:]) >= 36 else SmallCNN)(shape_chw, layer_norm)
