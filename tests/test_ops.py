"""The CPU fast paths of training: NumPy's tanh with torch's backward, and Adam with gradient clipping
over one flat vector, against torch's own (and an optimizer state saved per tensor resumes)."""
import copy
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from sf_engine.ops import FlatAdam, Tanh
from sf_engine.weights import flatten_state


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tanh_matches_torch_in_values_and_gradients(dtype):
    x = (torch.randn(257, 33, dtype=dtype) * 3).requires_grad_()
    y = Tanh()(x)
    reference_x = x.detach().clone().requires_grad_()
    reference = torch.tanh(reference_x)
    torch.testing.assert_close(y, reference)
    grad = torch.randn_like(y)
    y.backward(grad)
    reference.backward(grad)
    torch.testing.assert_close(x.grad, reference_x.grad)
    assert y.grad_fn is not None and "NumpyTanh" in type(y.grad_fn).__name__  # the fast path was taken


def test_tanh_without_autograd_matches_torch():
    x = torch.randn(128, 64) * 3
    with torch.inference_mode():  # as the policy worker acts
        torch.testing.assert_close(Tanh()(x), torch.tanh(x))
    with torch.no_grad():
        assert Tanh()(x.requires_grad_()).grad_fn is None


def test_tanh_is_torch_tanh_when_traced():
    traced = torch.jit.trace(Tanh(), torch.zeros(2, 3))
    assert "aten::tanh" in str(traced.graph)


def _net():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 16), Tanh(), nn.Linear(16, 3))
    net[0].to(memory_format=torch.channels_last)  # the layout the CNN encoders use
    return net


def _loss(net, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 3, 8, 8, generator=generator).contiguous(memory_format=torch.channels_last)
    return (net(x) ** 2).mean() * 50  # gradients large enough to be clipped


def test_flat_adam_takes_torch_adam_and_clipping_steps():
    net, reference = _net(), _net()
    flat = flatten_state(net)
    optimizer = FlatAdam(net, flat, lr=1e-2, eps=1e-5)
    torch_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2, eps=1e-5)
    for seed in range(5):
        optimizer.zero_grad()
        _loss(net, seed).backward()
        norm = optimizer.clip_grad_norm(0.5)
        optimizer.step()
        torch_optimizer.zero_grad()
        _loss(reference, seed).backward()
        torch_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        torch_optimizer.step()
        torch.testing.assert_close(norm, torch_norm, rtol=1e-4, atol=1e-6)
        assert norm > 0.5  # the clipping was exercised
    for mine, theirs in zip(net.parameters(), reference.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)
    assert flat.data_ptr() == next(net.parameters()).data_ptr()  # the parameters are still the flat vector


def test_an_optimizer_state_saved_per_tensor_resumes_in_the_flat_one():
    reference = _net()
    torch_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2, eps=1e-5)
    for seed in range(3):
        torch_optimizer.zero_grad()
        _loss(reference, seed).backward()
        torch_optimizer.step()
    net = copy.deepcopy(reference)
    optimizer = FlatAdam(net, flatten_state(net), lr=1e-2, eps=1e-5)
    optimizer.load_state_dict(torch_optimizer.state_dict())
    optimizer.param_groups[0]["lr"] = torch_optimizer.param_groups[0]["lr"] = 5e-3  # as a resumed run sets it
    for opt, model in ((optimizer, net), (torch_optimizer, reference)):
        opt.zero_grad()
        _loss(model, 3).backward()
        opt.step()
    for mine, theirs in zip(net.parameters(), reference.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)



_REFAULTS = """
import resource, sys, torch
sys.path.insert(0, {repo!r})
from sf_engine.device import keep_freed_memory
kept = {keep} and keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for step in range(30):  # as a training step: large tensors of two sizes, small objects between them
    if step == 20:
        before = faults()
    images = torch.ones(64 << 20, dtype=torch.uint8)
    activations = torch.empty(1024, 4, 84, 84).fill_(1.0)
    small = [object() for _ in range(1000)]
    del images, activations
print(kept, faults() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_large_tensors_are_reused_without_new_page_faults():
    """The torch processes keep freed memory: once warm, a training step's large tensors made again cost
    no page faults (by default each is mapped anew: 44,000 faults a step here)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs = {}
    for keep in (False, True):
        out = subprocess.run([sys.executable, "-c", _REFAULTS.format(repo=repo, keep=keep)], capture_output=True,
                             text=True, check=True).stdout.split()
        runs[keep] = (out[0] == "True", int(out[1]))
    assert runs[True][0], "mallopt was refused"
    assert runs[False][1] > 10 * 40000
    assert runs[True][1] < 2000
