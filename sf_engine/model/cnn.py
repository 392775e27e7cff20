"""Convolutional encoders of image observations: the Nature DQN CNN, Sample Factory's simple conv net
(its Doom agents'), a small 3x3 CNN for tiny images and the IMPALA residual CNN. Input [B, C, H, W] float.
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
        super().__init__(
            nn.Sequential(
                init_layer(nn.Conv2d(shape[0], 32, 8, stride=4), math.sqrt(2)),
                nn.ReLU(),
                init_layer(nn.Conv2d(32, 64, 4, stride=2), math.sqrt(2)),
                nn.ReLU(),
                init_layer(nn.Conv2d(64, 64, 3, stride=1), math.sqrt(2)),
                nn.ReLU(),
                nn.Flatten(),
            ),
            shape,
            512,
            layer_norm=layer_norm,
        )


class SimpleCNN(_ConvEncoder):
    """Sample Factory's default image encoder ('convnet_simple', used for its Doom agents): 32 8x8/4,
    64 4x4/2 and 128 3x3/2 convolutions, then 512 units, all ELU."""

    def __init__(self, shape: tuple, layer_norm: bool = False):
        super().__init__(
            nn.Sequential(
                init_layer(nn.Conv2d(shape[0], 32, 8, stride=4), math.sqrt(2)),
                ELU(),
                init_layer(nn.Conv2d(32, 64, 4, stride=2), math.sqrt(2)),
                ELU(),
                init_layer(nn.Conv2d(64, 128, 3, stride=2), math.sqrt(2)),
                ELU(),
                nn.Flatten(),
            ),
            shape,
            512,
            activation=ELU,
            layer_norm=layer_norm,
        )


class SmallCNN(_ConvEncoder):
    """For images too small for the Nature CNN's 8x8/4 first layer (MiniGrid-style views): three 3x3
    convolutions at full resolution, then 256 units (ReLU)."""

    def __init__(self, shape: tuple, layer_norm: bool = False):
        super().__init__(
            nn.Sequential(
                init_layer(nn.Conv2d(shape[0], 16, 3, padding=1), math.sqrt(2)),
                nn.ReLU(),
                init_layer(nn.Conv2d(16, 32, 3, padding=1), math.sqrt(2)),
                nn.ReLU(),
                init_layer(nn.Conv2d(32, 32, 3, padding=1), math.sqrt(2)),
                nn.ReLU(),
                nn.Flatten(),
            ),
            shape,
            256,
            layer_norm=layer_norm,
        )


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaCNN(_ConvEncoder):
    """Espeholt et al. 2018: 3 stages of conv + max-pool + 2 residual blocks, then 256 units (ReLU)."""

    def __init__(self, shape: tuple, depths=(16, 32, 32), layer_norm: bool = False):
        layers, channels = [], shape[0]
        for depth in depths:
            layers += [
                nn.Conv2d(channels, depth, 3, padding=1),
                nn.MaxPool2d(3, stride=2, padding=1),
                _ResidualBlock(depth),
                _ResidualBlock(depth),
            ]
            channels = depth
        super().__init__(nn.Sequential(*layers, nn.ReLU(), nn.Flatten()), shape, 256, layer_norm=layer_norm)


def cnn_for(shape_chw: tuple, encoder: str, layer_norm: bool = False) -> nn.Module:
    """The CNN of --encoder for images of [C, H, W] `shape_chw` ('auto' / 'nature_cnn': the Nature
    CNN, or the small one for images under 36 pixels); `layer_norm`: a LayerNorm on its last layer."""
    if encoder == "impala_cnn":
        return ImpalaCNN(shape_chw, layer_norm=layer_norm)
    if encoder == "convnet_simple":
        return SimpleCNN(shape_chw, layer_norm)
    cnn = NatureCNN if min(shape_chw[1:]) >= 36 else SmallCNN
    return cnn(shape_chw, layer_norm)
