"""Two CPU costs of training a small network, cut (perf/learner_step.py measures them):

- `Tanh`: torch's CPU tanh is not vectorized (about 2.6 ns per float32 on one core, the same with
  every ATEN_CPU_CAPABILITY), NumPy's is (about 0.4 ns); on the CPU the forward runs NumPy's and the
  backward torch's tanh_backward. Elsewhere (CUDA, other dtypes, tracing for export, torch.compile)
  it is torch.tanh.
- `FlatAdam`: the parameters are already views into one flat vector (weights.flatten_state, for
  publishing); their gradients are made views into one flat gradient too, so gradient clipping is one
  norm and one multiply, and Adam one fused kernel over one tensor, instead of a handful of kernels
  per parameter tensor.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

_NUMPY_DTYPES = (torch.float32, torch.float64)


class _NumpyTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.from_numpy(np.tanh(x.detach().numpy()))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        y, = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


def tanh(x: torch.Tensor) -> torch.Tensor:
    if (x.device.type == "cpu" and x.dtype in _NUMPY_DTYPES and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling()):
        if torch.is_grad_enabled() and x.requires_grad:
            return _NumpyTanh.apply(x)
        return torch.from_numpy(np.tanh(x.detach().numpy()))  # acting: no autograd node to build
    return torch.tanh(x)


class Tanh(nn.Module):
    """nn.Tanh, with NumPy's vectorized tanh on the CPU (see above)."""

    def forward(self, x):
        return tanh(x)


def _channels_last(tensor: torch.Tensor) -> bool:
    return tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last) and not tensor.is_contiguous()


def flat_layout(tensor: torch.Tensor, like: torch.Tensor = None) -> torch.Tensor:
    """`tensor` as a 1-D tensor in the order a flat vector holds it: a channels-last 4-D tensor (or
    one shaped like the channels-last `like`) as [O, H, W, I]."""
    if _channels_last(tensor if like is None else like):
        return tensor.permute(0, 2, 3, 1).reshape(-1)
    return tensor.reshape(-1)


def view_like(chunk: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """`chunk` (1-D, tensor.numel() long) as a tensor of `tensor`'s shape and memory layout (the
    inverse of flat_layout)."""
    if _channels_last(tensor):
        out_c, in_c, height, width = tensor.shape
        return chunk.view(out_c, height, width, in_c).permute(0, 3, 1, 2)
    return chunk.view_as(tensor)


class FlatAdam:
    """Adam over the parameters of `model`, which must be views into the flat vector `flat` in the
    order of model.parameters(), first (weights.flatten_state lays them out so). zero_grad,
    clip_grad_norm and step each touch one flat tensor."""

    def __init__(self, model: nn.Module, flat: torch.Tensor, lr: float, eps: float):
        self._model_params = params = list(model.parameters())
        size = sum(p.numel() for p in params)
        self.param = nn.Parameter(flat[:size], requires_grad=True)  # shares flat's storage
        self.grad = torch.zeros_like(self.param)
        offset = 0
        for p in params:
            if p.data_ptr() != flat[offset:].data_ptr():
                raise ValueError("FlatAdam: the parameters are not laid out in the flat vector in order")
            p.grad = view_like(self.grad[offset:offset + p.numel()], p)  # autograd accumulates into it
            offset += p.numel()
        self.param.grad = self.grad
        fused = flat.device.type in ("cpu", "cuda")
        self.optimizer = torch.optim.Adam([self.param], lr=lr, eps=eps, fused=fused)

    @property
    def param_groups(self) -> list:
        return self.optimizer.param_groups  # load_state_dict replaces the list

    def zero_grad(self) -> None:
        self.grad.zero_()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Scale the gradient to norm <= max_norm (torch.nn.utils.clip_grad_norm_'s rule; 0: no
        clipping); returns the norm before."""
        norm = torch.linalg.vector_norm(self.grad)
        if max_norm > 0:
            self.grad.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return norm

    def step(self) -> None:
        self.optimizer.step()

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """A flat optimizer state, or one saved per parameter tensor (older checkpoints): merged."""
        per_tensor = state.get("state", {})
        if len(state.get("param_groups", [{}])[0].get("params", [])) > 1 and per_tensor:
            merged = {}
            for key in ("exp_avg", "exp_avg_sq"):
                merged[key] = torch.cat([flat_layout(per_tensor[i][key], p) for i, p in enumerate(self._model_params)])
            merged["step"] = torch.as_tensor(per_tensor[0]["step"], dtype=torch.float32).clone()
            group = {**state["param_groups"][0], "params": [0]}
            state = {"state": {0: merged}, "param_groups": [group]}
        self.optimizer.load_state_dict(state)
