"""CPU costs of acting with and training a small network, cut (perf/learner_step.py measures them):

- `mlp`: an MLP (linear layers, each followed by tanh, ReLU or nothing, optionally a layer norm
  before that: the value-based family's) as one compiled forward and
  one compiled backward (sf_engine/csrc/cpu_kernels.cpp, built by setup.py) on CPU float32, instead of
  an op and an autograd node per layer and activation; elsewhere (CUDA, other dtypes, autocast,
  tracing for export, torch.compile, or without the build) the same layers as torch ops.
- `Tanh`: torch's CPU tanh is not vectorized (about 2.6 ns per float32 on one core, the same with
  every ATEN_CPU_CAPABILITY), NumPy's is (about 0.4 ns); on the CPU the forward runs NumPy's and the
  backward torch's tanh_backward. Elsewhere (CUDA, other dtypes, tracing for export, torch.compile)
  it is torch.tanh.
- `ELU`: torch's CPU ELU computes a scalar expm1 per element; on the CPU (float32, bfloat16) it runs
  the compiled kernel's vector pass in place, about 2.5x faster (the backward is torch's).
- `image_affine`: uint8 images to a network's input (normalized, float32 or bfloat16) in one
  compiled pass instead of torch's four.
- `categorical_sample`: acting's categorical actions and their log-probabilities in one compiled pass over the
  logits by inverse CDF (one uniform per row), instead of the Gumbel-max's six ops and n exponentials per row.
A model's state as one flat vector, and Adam over it, are in sf_engine/model/flat_state.py.
"""

from __future__ import annotations

import functools
import importlib.util

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

_NUMPY_DTYPES = (torch.float32, torch.float64)
_KERNELS_VERSION = 6  # cpu_kernels.cpp's version(): a build of another version is not used
ACTIVATIONS = ("identity", "tanh", "relu")  # the kernels' activation codes are these indices


def _load_kernels():
    """The compiled CPU kernels as torch ops, or None when they were not built, do not load (built for
    another torch), are of another version (rebuild: `make`) or have only a scalar tanh."""
    spec = importlib.util.find_spec("sf_engine.model._cpu_kernels")
    if spec is None or spec.origin is None:
        return None
    try:
        torch.ops.load_library(spec.origin)
        ops = torch.ops.sf_engine_cpu
        return ops if ops.version() == _KERNELS_VERSION and ops.vector_tanh() else None
    except (OSError, RuntimeError, AttributeError):
        return None


KERNELS = _load_kernels()


class _CompiledMLP(torch.autograd.Function):
    """The MLP as one autograd node: the forward keeps every layer's output (and each layer norm's normalized
    rows and 1 / std), which the backward reads."""

    @staticmethod
    def forward(ctx, x, activations, num_layers, eps, *params):
        weights, biases, norm_weights, norm_biases = _split(params, num_layers)
        saved = KERNELS.mlp_forward(x, weights, biases, activations, norm_weights, norm_biases, eps, True)
        ctx.save_for_backward(x, *saved, *weights, *norm_weights)
        ctx.num_layers, ctx.activations = num_layers, activations
        return saved[-1]

    @staticmethod
    def backward(ctx, grad):
        tensors, num_layers = ctx.saved_tensors, ctx.num_layers
        x, saved = tensors[0], list(tensors[1 : 1 + 3 * num_layers])
        weights = list(tensors[1 + 3 * num_layers : 1 + 4 * num_layers])
        norm_weights = list(tensors[1 + 4 * num_layers :])
        grads = KERNELS.mlp_backward(grad, x, saved, weights, ctx.activations, norm_weights, ctx.needs_input_grad[0])
        return (grads[0] if ctx.needs_input_grad[0] else None, None, None, None, *grads[1:])


def _split(params: tuple, num_layers: int) -> tuple:
    """(weights, biases, norm weights, norm biases) of the flat parameters _layers lays out (the norm lists
    empty without norms)."""
    weights, biases = list(params[:num_layers]), list(params[num_layers : 2 * num_layers])
    norms = list(params[2 * num_layers :])
    return weights, biases, norms[: len(norms) // 2], norms[len(norms) // 2 :]


def use_kernels(x: torch.Tensor) -> bool:
    """Whether `mlp` runs the compiled kernels on x."""
    return (
        KERNELS is not None
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.dim() == 2
        and x.shape[0] > 0
        and not torch.is_autocast_enabled("cpu")
        and not torch.jit.is_tracing()
        and not torch.compiler.is_compiling()
    )


_NO_NORM = torch.empty(0)  # the kernels' "no layer norm here"


_STACKS: dict = {}  # id(linears) -> (linears, activations, norms, their _layers): what a model's stack calls for


def _layers(linears: list, activations: tuple, norms) -> tuple:
    """The kernels' arguments: weights, biases, activation codes, norm weights and biases (one per layer, empty
    where a layer has none; no entries when `norms` is None), the norms' epsilon. Built once per stack (the
    same lists and tuple, as a model keeps them): a parameter stays the same object for good (flatten_state,
    .to() and load_state_dict change its data, not the object), and reading it from its module each call
    cost more than the kernels' work on small batches."""
    cached = _STACKS.get(id(linears))
    if cached is not None and cached[0] is linears and cached[1] is activations and cached[2] is norms:
        return cached[3]
    if len(_STACKS) > 256:  # stacks built anew per call (none here) would grow it
        _STACKS.clear()
    layers = _build_layers(linears, activations, norms)
    _STACKS[id(linears)] = (linears, activations, norms, layers)
    return layers


def _build_layers(linears: list, activations: tuple, norms) -> tuple:
    codes = [ACTIVATIONS.index(name) for name in activations]
    if norms is None:
        norm_weights, norm_biases, eps = [], [], 1e-5
    else:
        norm_weights = [norm.weight if norm is not None else _NO_NORM for norm in norms]
        norm_biases = [norm.bias if norm is not None else _NO_NORM for norm in norms]
        eps = next((norm.eps for norm in norms if norm is not None), 1e-5)
    weights, biases = [linear.weight for linear in linears], [linear.bias for linear in linears]
    return weights, biases, codes, norm_weights, norm_biases, eps


def mlp_outputs(x: torch.Tensor, linears: list, activations: tuple, norms=None) -> list:
    """What the compiled forward of mlp(x) keeps (each layer norm's normalized rows and 1 / std, then every
    layer's output: the last is the MLP's), without autograd: what mlp_backward_into needs."""
    weights, biases, codes, norm_weights, norm_biases, eps = _layers(linears, activations, norms)
    return KERNELS.mlp_forward(x, weights, biases, codes, norm_weights, norm_biases, eps, True)


def mlp_backward_into(
    grad: torch.Tensor, x: torch.Tensor, outputs: list, linears: list, activations: tuple, norms=None
) -> None:
    """The backward of mlp_outputs(x) for the gradient `grad` of its output: each parameter's gradient
    added into its .grad (the optimizer's flat gradient: no autograd node, no temporary gradients)."""
    weights, biases, codes, norm_weights, norm_biases, _ = _layers(linears, activations, norms)
    grads = [[p.grad for p in group] for group in (weights, biases)]
    grads += [[p.grad if p.numel() else _NO_NORM for p in group] for group in (norm_weights, norm_biases)]
    KERNELS.mlp_backward_into(grad, x, outputs, weights, codes, norm_weights, *grads)


def mlp(x: torch.Tensor, linears: list, activations: tuple, norms=None, kernels: bool = None) -> torch.Tensor:
    """x [B, I] through each nn.Linear of `linears`, then its nn.LayerNorm in `norms` (None: none at all; an
    entry None: none after that layer), then its activation (a name of ACTIVATIONS).
    `kernels` forces the compiled kernels (True) or torch ops (False); None: the kernels where they run."""
    if kernels if kernels is not None else use_kernels(x):
        weights, biases, codes, norm_weights, norm_biases, eps = _layers(linears, activations, norms)
        params = [p.contiguous() for p in weights + biases + norm_weights + norm_biases]
        if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params)):
            return _CompiledMLP.apply(x, codes, len(linears), eps, *params)
        weights, biases, norm_weights, norm_biases = _split(params, len(linears))
        return KERNELS.mlp_forward(x, weights, biases, codes, norm_weights, norm_biases, eps, False)[0]
    for linear, name, norm in zip(linears, activations, norms or (None,) * len(linears)):
        x = F.linear(x, linear.weight, linear.bias)
        x = norm(x) if norm is not None else x
        x = tanh(x) if name == "tanh" else torch.relu(x) if name == "relu" else x
    return x


class _NumpyTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.from_numpy(np.tanh(x.detach().numpy()))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


def tanh(x: torch.Tensor) -> torch.Tensor:
    if (
        x.device.type == "cpu"
        and x.dtype in _NUMPY_DTYPES
        and not torch.jit.is_tracing()
        and not torch.compiler.is_compiling()
    ):
        if torch.is_grad_enabled() and x.requires_grad:
            return _NumpyTanh.apply(x)
        return torch.from_numpy(np.tanh(x.detach().numpy()))  # acting: no autograd node to build
    return torch.tanh(x)


class Tanh(nn.Module):
    """nn.Tanh, with NumPy's vectorized tanh on the CPU (see above)."""

    def forward(self, x):
        return tanh(x)


class _KernelELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        KERNELS.elu_(x)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return torch.ops.aten.elu_backward(grad, 1.0, 1.0, 1.0, True, y)


def elu_(x: torch.Tensor) -> torch.Tensor:
    """ELU (alpha 1) of x, in place where the compiled kernel runs (a contiguous or channels-last CPU
    float32 or bfloat16 tensor that is not a view, nor a leaf that needs a gradient), else torch's F.elu."""
    dense = x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last)
    if (
        KERNELS is None
        or x.device.type != "cpu"
        or x.dtype not in (torch.float32, torch.bfloat16)
        or not dense
        or x._base is not None
        or (x.is_leaf and x.requires_grad)
        or torch.jit.is_tracing()
        or torch.compiler.is_compiling()
    ):
        return F.elu(x)
    if torch.is_grad_enabled() and x.requires_grad:
        return _KernelELU.apply(x)
    return KERNELS.elu_(x)


def image_affine(rows: torch.Tensor, scale, shift, bf16: bool):
    """uint8 images [B, H, W, C] -> (x / 255 - mean) / std clipped to 5 std (`scale`, `shift` [H, W, C]
    from a normalizer's image_affine), or x / 255 (None, None), in float32 or (`bf16`) bfloat16, by
    the compiled kernel in one pass; None where it does not run (not the CPU, tracing, compiling)."""
    if (
        KERNELS is None
        or rows.device.type != "cpu"
        or rows.dtype != torch.uint8
        or rows.shape[0] == 0
        or torch.jit.is_tracing()
        or torch.compiler.is_compiling()
    ):
        return None
    if scale is None:
        return KERNELS.image_affine(rows, *_unit_affine(rows[0].numel()), 0.0, 1.0, bf16)
    return KERNELS.image_affine(rows, scale, shift, -5.0, 5.0, bf16)


@functools.lru_cache(maxsize=8)
def _unit_affine(pixels: int) -> tuple:
    """(scale, shift) of x / 255 for images of `pixels` values (normal tensors, even when first asked
    for under inference mode)."""
    with torch.inference_mode(False):
        return torch.full((pixels,), 1.0 / 255.0), torch.zeros(pixels)


class ELU(nn.Module):
    """nn.ELU with the compiled kernel on the CPU (see above). In place on its input: only after a layer
    whose output nothing else reads (a convolution's, a linear layer's)."""

    def forward(self, x):
        return elu_(x)


def categorical_sample(logits: torch.Tensor):
    """(actions [B] int64, log-probs [B]) sampled from the categorical `logits` [B, n] in one compiled pass, with
    torch's generator's uniforms (torch.manual_seed governs it); None where `use_kernels(logits)` is not so."""
    if not use_kernels(logits):
        return None
    return tuple(KERNELS.categorical_sample(logits, torch.rand(logits.shape[0])))
