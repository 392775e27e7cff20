"""The CPU fast paths of acting and training: the compiled MLP, NumPy's tanh with torch's backward, and
Adam with gradient clipping over one flat vector, against torch's own (and an optimizer state saved per
tensor resumes)."""

import copy
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sf_engine.model import kernels
from sf_engine.model.flat_state import FlatAdam, flatten_state
from sf_engine.model.kernels import Tanh

needs_kernels = pytest.mark.skipif(kernels.KERNELS is None, reason="the compiled CPU kernels are not built")


def test_the_compiled_kernels_are_built_where_setup_py_builds_them():
    """Fail if they are missing where setup.py builds them with glibc's vector tanh (x86-64, glibc >= 2.35)."""
    from conftest import compiled_kernels_expected

    if kernels.KERNELS is None and not compiled_kernels_expected():
        pytest.skip("the compiled kernels are built only on x86-64 with glibc >= 2.35")
    assert kernels.KERNELS is not None, "the compiled CPU kernels are not built: pip install --no-build-isolation -e ."


@needs_kernels
@pytest.mark.parametrize("batch", [1, 127, 128, 1000])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("layer_norm", [False, True], ids=["plain", "layer_norm"])
def test_compiled_mlp_matches_torch_ops_in_values_and_gradients(batch, activation, layer_norm):
    """Whole batches of rows (128 at a time in the kernel) and remainders; hidden layers (with a layer norm
    before the activation, its weights away from 1 and 0), then a head without activation or norm; the
    gradient of the input too, and of the norms' weights."""
    torch.manual_seed(batch)
    linears = [nn.Linear(5, 64), nn.Linear(64, 32), nn.Linear(32, 3)]
    activations = (activation, activation, "identity")
    norms = [nn.LayerNorm(64), nn.LayerNorm(32), None] if layer_norm else None
    for norm in norms or []:
        if norm is not None:
            nn.init.normal_(norm.weight, 1.0, 0.5), nn.init.normal_(norm.bias, 0.0, 0.5)
    modules = linears + [norm for norm in norms or [] if norm is not None]
    params = [p for module in modules for p in module.parameters()]
    x = (torch.randn(batch, 5) * 2).requires_grad_()
    compiled = kernels.mlp(x, linears, activations, kernels=True, norms=norms)
    assert type(compiled.grad_fn).__name__ == "_CompiledMLPBackward"  # the kernels ran
    reference = kernels.mlp(x, linears, activations, kernels=False, norms=norms)
    torch.testing.assert_close(compiled, reference)
    grad = torch.randn_like(compiled)
    for got, expected in zip(
        torch.autograd.grad(compiled, [x] + params, grad), torch.autograd.grad(reference, [x] + params, grad)
    ):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    with torch.inference_mode():  # as the policy worker acts: the forward only, nothing kept
        torch.testing.assert_close(kernels.mlp(x.detach(), linears, activations, norms=norms), reference.detach())


def test_actor_critic_stacks_match_its_modules():
    """Separate MLP encoders over one vector: each encoder and its head run as one MLP (kernels.mlp)."""
    from sf_engine.envs import ActionSpec, EnvSpec
    from sf_engine.model.actor_critic import ActorCritic
    from sf_engine.model.shape import resolve_model_config
    from sf_engine.run.plan import build_plan

    cfg = build_plan(["--mode", "serial", "--restart", "--num_workers", "1", "--num_envs_per_worker", "8"]).cfg
    spec = EnvSpec(obs=(("obs", (4,), "float32"),), action=ActionSpec("discrete", nvec=(3,)), family="classic")
    model = ActorCritic(spec, resolve_model_config(cfg.model, spec))
    assert model._stacks is not None
    obs = {"obs": torch.randn(300, 4)}
    params, values = model(obs)
    torch.testing.assert_close(params, model.policy_head(model.actor_encoder(obs)))
    torch.testing.assert_close(values, model.value_head(model.critic_encoder(obs)).squeeze(-1))
    torch.testing.assert_close(model.values(obs), values)


@needs_kernels
def test_direct_gradients_match_autograd_through_the_model_and_loss():
    """The learner's step for separate MLP stacks with categorical actions (CartPole's model): compiled
    forward, loss and backward into the optimizer's flat gradient, against autograd through forward()
    and ppo_loss.DiscretePPOLoss (its torch ops)."""
    from sf_engine.algo.ppo import loss as ppo_loss
    from sf_engine.envs import ActionSpec, EnvSpec
    from sf_engine.model.actor_critic import ActorCritic
    from sf_engine.model.shape import resolve_model_config
    from sf_engine.run.plan import build_plan

    cfg = build_plan(
        [
            "--mode",
            "serial",
            "--restart",
            "--num_workers",
            "1",
            "--num_envs_per_worker",
            "8",
            "--normalize_input",
            "true",
            "--normalize_returns",
            "true",
        ]
    ).cfg
    spec = EnvSpec(obs=(("obs", (4,), "float32"),), action=ActionSpec("discrete", nvec=(3,)), family="classic")
    model = ActorCritic(spec, resolve_model_config(cfg.model, spec))
    optimizer = FlatAdam(model, flatten_state(model), lr=1e-3, eps=1e-5)
    torch.manual_seed(1)
    obs = {"obs": torch.randn(700, 4) * 2}
    model.update_normalizers(obs, torch.randn(700) * 5)  # normalized inputs and returns
    actions, old_log_probs = torch.randint(0, 3, (700,)), torch.randn(700) * 0.3 - 1.1
    advantages, returns = ppo_loss.normalize(torch.randn(700)), model.normalize_returns(torch.randn(700) * 5)
    assert model.direct_gradients(obs)
    optimizer.zero_grad()
    stats = model.loss_gradients(
        obs,
        lambda logits, values: ppo_loss.discrete_loss_and_grads(
            logits, values, actions, old_log_probs, advantages, returns, ppo_loss.LossCoefficients(0.2, 0.5, 0.01)
        )[1:],
    )
    direct = optimizer.grad.clone()
    optimizer.zero_grad()
    params, values = model(obs)
    loss, reference_stats = ppo_loss.DiscretePPOLoss.apply(
        params, values, actions, old_log_probs, advantages, returns, ppo_loss.LossCoefficients(0.2, 0.5, 0.01), False
    )
    loss.backward()
    assert direct.abs().sum() > 0
    torch.testing.assert_close(direct, optimizer.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(stats, reference_stats, rtol=1e-4, atol=1e-6)


def test_mlp_runs_torch_ops_where_the_kernels_do_not():
    linears = [nn.Linear(4, 8)]
    x = torch.randn(3, 4)
    assert not kernels.use_kernels(x.double()) and not kernels.use_kernels(torch.zeros(0, 4))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # --bf16: autocast's own matrix products
        assert not kernels.use_kernels(x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = linears[0]

        def forward(self, x):
            return kernels.mlp(x, [self.linear], ("tanh",))

    traced = torch.jit.trace(Net(), x)  # export traces torch ops
    assert "aten::linear" in str(traced.graph) and "sf_engine_cpu" not in str(traced.graph)


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


def test_flat_adam_without_the_fused_kernel_takes_the_same_steps():
    """Where torch has no fused Adam for the device, FlatAdam's own arithmetic: torch's Adam steps."""
    net, reference = _net(), _net()
    optimizer = FlatAdam(net, flatten_state(net), lr=1e-2, eps=1e-5)
    optimizer.param_groups[0]["fused"] = False
    torch_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2, eps=1e-5)
    for seed in range(5):
        for opt, model in ((optimizer, net), (torch_optimizer, reference)):
            opt.zero_grad()
            _loss(model, seed).backward()
            opt.step()
    for mine, theirs in zip(net.parameters(), reference.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)


def test_flat_adam_state_is_torch_adams():
    """FlatAdam's state_dict loads into torch's Adam over one flat parameter and back (checkpoints of
    either), and both then take the same step; FlatAdam keeps its own settings (lr, eps: a resumed run's
    flags), where torch's Adam takes the saved ones."""
    net = _net()
    optimizer = FlatAdam(net, flatten_state(net), lr=1e-2, eps=1e-5)
    for seed in range(3):
        optimizer.zero_grad()
        _loss(net, seed).backward()
        optimizer.step()
    flat = torch.nn.Parameter(optimizer.param.detach().clone())
    torch_optimizer = torch.optim.Adam([flat], lr=1e-3, eps=1e-5)
    torch_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    assert torch_optimizer.param_groups[0]["lr"] == 1e-2  # the saved step size, as a resume takes it
    copied = copy.deepcopy(net)
    resumed = FlatAdam(copied, flatten_state(copied), lr=2e-3, eps=1e-4)
    resumed.load_state_dict(torch_optimizer.state_dict())
    assert (resumed.param_groups[0]["lr"], resumed.param_groups[0]["eps"]) == (2e-3, 1e-4)  # its own, not the saved
    torch_optimizer.param_groups[0].update(lr=2e-3, eps=1e-4)
    optimizer.zero_grad()
    _loss(net, 3).backward()
    flat.grad = optimizer.grad.clone()
    resumed.grad.copy_(optimizer.grad)
    torch_optimizer.step()
    resumed.step()
    torch.testing.assert_close(resumed.param.detach(), flat.detach(), rtol=1e-5, atol=1e-6)


def test_training_imports_no_torch_dynamo():
    """Building FlatAdam and stepping it leaves torch._dynamo unimported (about 0.75 s of every process that
    trains, the main one's auto sizing included, when a torch optimizer is built)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        f"import sys; sys.path.insert(0, {repo!r}); import torch; from torch import nn; "
        "from sf_engine.model.flat_state import FlatAdam, flatten_state; net = nn.Linear(3, 2); "
        "opt = FlatAdam(net, flatten_state(net), lr=1e-3, eps=1e-5); net(torch.ones(4, 3)).sum().backward(); "
        "opt.step(); opt.load_state_dict(opt.state_dict()); print('torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


_REFAULTS = """
import resource, sys, torch
sys.path.insert(0, {repo!r})
from sf_engine.runtime.device import keep_freed_memory
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
        out = subprocess.run(
            [sys.executable, "-c", _REFAULTS.format(repo=repo, keep=keep)], capture_output=True, text=True, check=True
        ).stdout.split()
        runs[keep] = (out[0] == "True", int(out[1]))
    assert runs[True][0], "mallopt was refused"
    assert runs[False][1] > 10 * 40000
    assert runs[True][1] < 2000


def test_images_are_normalized_per_pixel_with_normalize_input():
    """--normalize_input on images: the learner's statistics are per pixel and channel of x / 255, and the
    encoder's input is (x / 255 - mean) / std, clipped to 5, in the [B, C, H, W] layout the CNN takes."""
    from sf_engine.config.groups import ModelConfig
    from sf_engine.envs import ActionSpec, EnvSpec
    from sf_engine.model.actor_critic import ActorCritic
    from sf_engine.model.shape import resolve_model_config

    spec = EnvSpec((("screen", (12, 16, 3), "uint8"),), ActionSpec("discrete", nvec=(3,)), family="image")
    model = ActorCritic(spec, resolve_model_config(ModelConfig(normalize_input=True), spec))
    torch.manual_seed(0)
    frames = (torch.rand(64, 12, 16, 3) * torch.linspace(10, 250, 16).view(1, 1, 16, 1)).to(torch.uint8)
    model.update_normalizers({"screen": frames}, torch.zeros(64))
    seen = frames[::4].double() / 255.0  # the rows the statistics were taken from
    normalizer = model.actor_encoder.normalizers["screen"]
    torch.testing.assert_close(normalizer.mean.double(), seen.mean(0), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(normalizer.var.double(), seen.var(0, unbiased=False), rtol=1e-3, atol=1e-4)
    prepared = model.actor_encoder.prepare("screen", frames)
    expected = ((frames.float() / 255.0 - normalizer.mean) / torch.sqrt(normalizer.var + 1e-5)).clamp(-5, 5)
    assert prepared.shape == (64, 3, 12, 16)
    torch.testing.assert_close(prepared, expected.permute(0, 3, 1, 2), rtol=1e-5, atol=1e-5)
    assert prepared.abs().max() <= 5.0 and 0.5 < prepared.std() < 1.5


def test_unit_weight_init_is_orthogonal_with_gain_one_everywhere():
    """--weight_init unit (the Doom family's, Sample Factory's): every conv and linear layer, the heads
    included, orthogonal with gain 1 and zero bias; 'ppo' keeps the 0.01 policy head."""
    from sf_engine.config.groups import ModelConfig
    from sf_engine.envs import ActionSpec, EnvSpec
    from sf_engine.model.actor_critic import ActorCritic
    from sf_engine.model.shape import resolve_model_config

    spec = EnvSpec((("screen", (72, 128, 3), "uint8"),), ActionSpec("discrete", nvec=(4,)), family="doom")
    unit = ActorCritic(spec, resolve_model_config(ModelConfig(encoder="convnet_simple", weight_init="unit"), spec))
    layers = [m for m in unit.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    assert len(layers) == 6  # three convolutions, the 512-unit layer and two heads
    for layer in layers:
        singular = torch.linalg.svdvals(layer.weight.detach().reshape(layer.weight.shape[0], -1))
        torch.testing.assert_close(singular, torch.ones_like(singular), rtol=1e-4, atol=1e-4)
        assert not layer.bias.detach().any()
    ppo = ActorCritic(spec, resolve_model_config(ModelConfig(encoder="convnet_simple"), spec))
    rows = ppo.policy_head.weight.detach().norm(dim=1)
    torch.testing.assert_close(rows, torch.full_like(rows, 0.01), rtol=1e-4, atol=1e-6)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_elu_kernel_matches_torch_in_values_and_gradients(dtype):
    """kernels.ELU (the compiled pass, in place) on a channels-last convolution's output against F.elu: values
    (bfloat16 rounded as torch rounds), the input's gradient, and NaN, infinities and zeros."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last).to(dtype)
    x = (torch.randn(4, 3, 9, 11) * 3).to(dtype).contiguous(memory_format=torch.channels_last).requires_grad_()
    out, ref = kernels.ELU()(conv(x)), F.elu(conv(x))
    atol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out, ref, rtol=atol, atol=atol)
    assert out.is_contiguous(memory_format=torch.channels_last)
    weights = torch.randn(out.shape, dtype=dtype)
    (grad,) = torch.autograd.grad((out * weights).sum(), x)
    (grad_ref,) = torch.autograd.grad((ref * weights).sum(), x)
    torch.testing.assert_close(grad, grad_ref, rtol=atol * 10, atol=atol * 10)
    y = conv(x)
    assert kernels.ELU()(y).data_ptr() == y.data_ptr()  # the kernel ran (in place), under autograd too
    with torch.inference_mode():
        y = conv(x)
        assert kernels.ELU()(y).data_ptr() == y.data_ptr()
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, 50.0, -50.0, -1e-3], dtype=dtype)
    torch.testing.assert_close(kernels.elu_(special.clone()), F.elu(special), equal_nan=True, rtol=1e-5, atol=1e-6)


@needs_kernels
@pytest.mark.parametrize("normalize", [False, True], ids=["x/255", "normalized"])
@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
def test_image_preparation_kernel_matches_torch_ops(normalize, bf16, monkeypatch):
    """The compiled one-pass image preparation gives the encoder the input torch's ops give it: float32
    the same, bfloat16 one rounding of the float32 value (torch's ops round after every step)."""
    from sf_engine.config.groups import ModelConfig
    from sf_engine.envs import ActionSpec, EnvSpec
    from sf_engine.model.actor_critic import ActorCritic
    from sf_engine.model.shape import resolve_model_config

    spec = EnvSpec((("screen", (12, 16, 3), "uint8"),), ActionSpec("discrete", nvec=(3,)), family="image")
    model = ActorCritic(spec, resolve_model_config(ModelConfig(normalize_input=normalize), spec))
    torch.manual_seed(1)
    frames = torch.randint(0, 256, (16, 12, 16, 3), dtype=torch.uint8)
    if normalize:
        model.update_normalizers({"screen": frames[:8] // 2}, torch.zeros(8))  # some values clip at 5 std
    assert kernels.image_affine(frames, None, None, bf16) is not None  # the kernel runs here
    compiled = model.actor_encoder.prepare("screen", frames, bf16)
    assert model.actor_encoder.prepare("screen", frames[:0], bf16).shape == (0, 3, 12, 16)
    monkeypatch.setattr(kernels, "KERNELS", None)
    reference = model.actor_encoder.prepare("screen", frames, False)
    assert compiled.shape == reference.shape == (16, 3, 12, 16)
    assert compiled.dtype == (torch.bfloat16 if bf16 else torch.float32)
    if bf16:  # within one bfloat16 rounding of the float32 input
        torch.testing.assert_close(compiled.float(), reference, rtol=2**-8, atol=1e-6)
    else:
        torch.testing.assert_close(compiled, reference, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(
    not __import__("sf_engine.runtime.device", fromlist=["x"]).cpu_has_native_bf16(),
    reason="--bf16 needs a CPU with native bfloat16",
)
def test_bf16_acting_runs_copies_refreshed_with_the_weights():
    """--bf16 acting (the policy worker): bfloat16 copies of the encoder's and the GRU's weights, kept out
    of the state dict; outputs within bfloat16's precision of the float32 model's, and after the weights
    change in place (a load), the next forward follows them (no stale copy); with gradients (the
    learner) autocast runs as before."""
    from sf_engine.config.groups import ModelConfig
    from sf_engine.envs import ActionSpec, EnvSpec
    from sf_engine.model.actor_critic import ActorCritic
    from sf_engine.model.shape import resolve_model_config

    spec = EnvSpec((("screen", (72, 128, 3), "uint8"),), ActionSpec("discrete", nvec=(4,)), family="doom")
    mcfg = resolve_model_config(ModelConfig(encoder="convnet_simple", rnn="gru", rnn_size=64, weight_init="unit"), spec)
    torch.manual_seed(2)
    full, acting = ActorCritic(spec, mcfg), ActorCritic(spec, mcfg, bf16=True)
    acting.load_state_dict(full.state_dict())
    acting.refresh_bf16_acting()
    assert acting.state_dict().keys() == full.state_dict().keys()
    obs = {"screen": torch.randint(0, 256, (8, 72, 128, 3), dtype=torch.uint8)}
    state = torch.randn(8, 64) * 0.5

    def outputs(model):
        with torch.inference_mode():
            return torch.cat([t.reshape(8, -1) for t in model(obs, state)], dim=1)

    torch.testing.assert_close(outputs(acting), outputs(full), rtol=0.05, atol=0.03)
    with torch.no_grad():
        for param in full.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    before = outputs(acting)
    assert (before - outputs(full)).abs().max() > 0.2  # the change shows
    acting.load_state_dict(full.state_dict())  # in place, as the policy worker's weight reload
    torch.testing.assert_close(outputs(acting), outputs(full), rtol=0.05, atol=0.03)
    params, values, new_state = acting(obs, state)  # gradients on: autocast over the float32 weights
    assert params.requires_grad and new_state.dtype == torch.float32
