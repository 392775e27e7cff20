"""A model's whole state as one flat float32 vector, and Adam over it (perf/learner_step.py measures them):

- `flatten_state`: every parameter and floating buffer of a model becomes a view into one flat vector, so
  publishing the weights (sf_engine.runtime.weights) and loading them are one copy each.
- `FlatAdam`: the parameters are already views into that vector; their gradients are made views into one
  flat gradient too, so gradient clipping is one norm and one multiply, and Adam one fused kernel over one
  tensor, instead of a handful of kernels per parameter tensor.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


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


def flatten_state(model):
    """Make every parameter and floating buffer (normalizer statistics) of the nn.Module `model` a view
    into one flat float32 tensor (returned), the parameters first in the order of model.parameters():
    publishing and loading the whole state is then one copy. Channels-last conv weights keep their
    layout."""
    tensors = [("param", m, n, t) for m in model.modules() for n, t in m._parameters.items() if t is not None]
    tensors += [
        ("buffer", m, n, t)
        for m in model.modules()
        for n, t in m._buffers.items()
        if t is not None and t.is_floating_point()
    ]
    flat = torch.cat([flat_layout(t.detach()).float() for _, _, _, t in tensors]).contiguous()
    offset = 0
    for kind, module, name, tensor in tensors:
        view = view_like(flat[offset : offset + tensor.numel()], tensor)
        if kind == "param":
            tensor.data = view
        else:
            module._buffers[name] = view
        offset += tensor.numel()
    return flat


class FlatAdam:
    """Adam over the parameters of `model`, which must be views into the flat vector `flat` in the
    order of model.parameters(), first (flatten_state lays them out so). zero_grad,
    clip_grad_norm and step each touch one flat tensor. Its state and state_dict are torch.optim.Adam's
    (one parameter group of one tensor), kept here: building a torch optimizer imports torch._dynamo,
    about 0.75 s of every process that trains (the learner's, and the main one's auto sizing). Its
    settings are the ones it was built with (and set_learning_rate's), never a loaded state's."""

    def __init__(self, model: nn.Module, flat: torch.Tensor, lr: float, eps: float):
        self._model_params = params = list(model.parameters())
        size = sum(p.numel() for p in params)
        self.param = nn.Parameter(flat[:size], requires_grad=True)  # shares flat's storage
        self.grad = torch.zeros_like(self.param)
        offset = 0
        for p in params:
            if p.data_ptr() != flat[offset:].data_ptr():
                raise ValueError("FlatAdam: the parameters are not laid out in the flat vector in order")
            p.grad = view_like(self.grad[offset : offset + p.numel()], p)  # autograd accumulates into it
            offset += p.numel()
        self.param.grad = self.grad
        self.param_groups = [_adam_group(lr, eps, fused=flat.device.type in ("cpu", "cuda"))]
        self.state: dict = {}  # step (float32 scalar on the parameter's device), exp_avg, exp_avg_sq
        # data-parallel learners (sf_engine.runtime.ranks): the gradient's mean over the ranks, in place, taken
        # once per gradient (by clip_grad_norm, else by step); None: one learner
        self.average: Callable[[torch.Tensor], torch.Tensor] | None = None
        self._averaged = False

    def zero_grad(self) -> None:
        self.grad.zero_()
        self._averaged = False

    def _average(self) -> None:
        if self.average is not None and not self._averaged:
            self.average(self.grad)
            self._averaged = True

    def clip_grad_norm(self, max_norm: float, loss: torch.Tensor | None = None) -> torch.Tensor:
        """Scale the gradient (with several learner ranks, its mean over them) to norm <= max_norm
        (torch.nn.utils.clip_grad_norm_'s rule; 0: no clipping); returns the norm before. `loss`: the loss (or loss
        statistics) of this gradient: with several ranks, where one is not finite the gradient is made NaN before
        the mean, so that every rank's norm is not finite and every rank skips the step (one rank skipping alone
        would part their weights)."""
        if loss is not None and self.average is not None and not bool(torch.isfinite(loss).all()):
            self.grad.fill_(float("nan"))
        self._average()
        norm = torch.linalg.vector_norm(self.grad)
        if max_norm > 0:
            self.grad.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return norm

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step: torch's fused Adam kernel on the flat vector where torch has it for the device (without
        Optimizer.step's own Python, about 25 us per call: 2% of a CartPole minibatch), else its arithmetic."""
        self._average()
        group, state = self.param_groups[0], self.state
        if not state:  # as torch's Adam initializes it
            state["step"] = torch.zeros((), dtype=torch.float32, device=self.param.device)
            state["exp_avg"] = torch.zeros_like(self.param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(self.param, memory_format=torch.preserve_format)
        state["step"] += 1
        (beta1, beta2), lr, eps = group["betas"], group["lr"], group["eps"]
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        if group["fused"] and hasattr(torch, "_fused_adam_"):
            torch._fused_adam_(
                [self.param], [self.grad], [exp_avg], [exp_avg_sq], [], [state["step"]], amsgrad=False,
                lr=lr, beta1=beta1, beta2=beta2, weight_decay=0.0, eps=eps, maximize=False,
            )  # fmt: skip
            return
        step = float(state["step"])
        exp_avg.lerp_(self.grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(self.grad, self.grad, value=1 - beta2)
        denominator = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(eps)
        self.param.addcdiv_(exp_avg, denominator, value=-lr / (1 - beta1**step))

    def state_dict(self) -> dict:
        """torch.optim.Adam's layout: {"state": {0: ...}, "param_groups": [group with "params": [0]]}."""
        return {"state": {0: dict(self.state)} if self.state else {}, "param_groups": [dict(self.param_groups[0])]}

    def load_state_dict(self, state: dict) -> None:
        """A flat optimizer state, or one saved per parameter tensor (older checkpoints): merged. Only the moments
        and the step count are taken; the settings (lr, betas, eps) stay this optimizer's, those of the run's
        flags (where torch's load_state_dict takes the saved ones): a resumed run with another --adam_eps or
        --learning_rate, or a PBT member copying another's state, keeps its own."""
        saved_group = state["param_groups"][0]
        if saved_group.get("amsgrad") or saved_group.get("maximize") or saved_group.get("weight_decay"):
            raise ValueError("FlatAdam: the saved optimizer state uses amsgrad, maximize or weight decay")
        per_tensor = state.get("state", {})
        if len(saved_group.get("params", [])) > 1 and per_tensor:
            merged = {}
            for key in ("exp_avg", "exp_avg_sq"):
                merged[key] = torch.cat([flat_layout(per_tensor[i][key], p) for i, p in enumerate(self._model_params)])
            merged["step"] = per_tensor[0]["step"]
            per_tensor = {0: merged}
        self.state = {}
        if per_tensor:
            saved = per_tensor[0] if 0 in per_tensor else next(iter(per_tensor.values()))
            device, dtype = self.param.device, self.param.dtype
            self.state = {
                "step": torch.as_tensor(saved["step"], dtype=torch.float32).clone().to(device),
                "exp_avg": saved["exp_avg"].to(device, dtype).clone().reshape(self.param.shape),
                "exp_avg_sq": saved["exp_avg_sq"].to(device, dtype).clone().reshape(self.param.shape),
            }


def _adam_group(lr: float, eps: float, fused: bool) -> dict:
    """torch.optim.Adam's parameter group of one tensor (its defaults but lr and eps)."""
    return {
        "lr": lr,
        "betas": (0.9, 0.999),
        "eps": eps,
        "weight_decay": 0.0,
        "amsgrad": False,
        "maximize": False,
        "foreach": None,
        "capturable": False,
        "differentiable": False,
        "fused": fused,
        "decoupled_weight_decay": False,
        "params": [0],
    }
