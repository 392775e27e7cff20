"""SAC (--algo sac): the squashed Gaussian's log-probabilities, mode and scaling against references written here,
one update against a plain-torch SAC step (with the compiled MLP kernels and without), the target critics'
Polyak steps, a fixed temperature, a skipped non-finite update, the state round trip, and the configuration's
one-line errors."""

import contextlib
import copy
import dataclasses
import io
import math

import numpy as np
import pytest
import torch
from conftest import assert_refused_untouched
from torch.distributions import Normal
from torch.nn import functional as F

from sf_engine.algo.base import TrainingHooks
from sf_engine.algo.batch import ReplayBatch
from sf_engine.algo.sac.learning import SAC
from sf_engine.envs.spec import ActionSpec
from sf_engine.model import kernels
from sf_engine.model.sac_networks import SquashedGaussian
from sf_engine.run.plan import build_plan

HOOKS = TrainingHooks(env_steps=lambda: 0, beat=lambda: None, stopping=lambda: False, elapsed_sec=lambda: 0.0)
SMALL = ["--mode", "serial", "--num_workers", "1", "--num_envs_per_worker", "4", "--hidden_size", "32"]
ASYMMETRIC = ActionSpec("continuous", shape=(2,), low=(-2.0, 0.0), high=(2.0, 1.0))


def sac_plan(tmp_path, *flags):
    return build_plan(["--algo", "sac", "--env", "Pendulum-v1", "--train_dir", str(tmp_path)] + SMALL + list(flags))


def make_sac(plan, seed: int = 0, action: ActionSpec = ASYMMETRIC) -> SAC:
    """The SAC of `plan` on Pendulum's observations with the actions of `action` (default: two dimensions with
    asymmetric bounds, so that scaling and the sums over dimensions are seen)."""
    torch.manual_seed(seed)
    return SAC(plan.cfg, dataclasses.replace(plan.spec, action=action), torch.device("cpu"), HOOKS)


def sac_batch(action: ActionSpec = ASYMMETRIC, rows: int = 200, seed: int = 0) -> ReplayBatch:
    """A minibatch as the replay buffer gives it: float observations, actions within the bounds, a fifth of the
    steps terminal (discount 0), importance weights in [0.1, 1)."""
    rng = np.random.default_rng(seed)

    def floats(*shape, scale=1.0):
        return torch.from_numpy((rng.normal(size=shape) * scale).astype(np.float32))

    actions = rng.uniform(action.low, action.high, (rows, len(action.low))).astype(np.float32)
    return ReplayBatch(
        obs={"obs": floats(rows, 3, scale=2.0)},
        actions=torch.from_numpy(actions),
        returns=floats(rows, scale=3.0),
        discounts=torch.from_numpy(np.where(rng.random(rows) < 0.2, 0.0, 0.99).astype(np.float32)),
        next_obs={"obs": floats(rows, 3, scale=2.0)},
        weights=torch.from_numpy(rng.uniform(0.1, 1.0, rows).astype(np.float32)),
    )


def usual_log_jacobian(u: torch.Tensor) -> torch.Tensor:
    """log(1 - tanh(u)^2 + tiny): the tanh's change of variables as it is usually written."""
    return torch.log(1 - torch.tanh(u).square() + 1e-6)


def exact_log_jacobian(u: torch.Tensor) -> torch.Tensor:
    """log(1 - tanh(u)^2) = log(sech(u)^2), exact in float64 for any |u| below 700."""
    return -2 * torch.log(torch.cosh(u))


def squashed_reference(params: torch.Tensor, noise: torch.Tensor, log_jacobian=usual_log_jacobian):
    """tanh(u), u = mean + std x noise, and its log-probability: the Gaussian's of u minus the log-Jacobian."""
    mean, log_std = params.chunk(2, dim=-1)
    u = mean + log_std.exp() * noise
    log_probs = Normal(mean, log_std.exp()).log_prob(u).sum(-1)
    return torch.tanh(u), log_probs - log_jacobian(u).sum(-1)


def test_rsample_log_probs_match_the_change_of_variables():
    """The log-probabilities (and their gradients) of the exact change of variables computed in float64; for
    moderate pre-tanh samples u those of the usual form too, which for large |u| (1 - tanh(u)^2 below
    float32's resolution) is off by several nats."""
    dist = SquashedGaussian(ASYMMETRIC)
    mean = torch.tensor([[0.3, -0.5], [1.0, 2.0], [-0.2, 0.1], [9.0, -12.0], [-15.0, 0.0], [6.0, 30.0]])
    log_std = torch.tensor([[0.0, -1.0], [-0.5, 0.5], [-3.0, -2.0], [-2.0, -1.0], [0.0, -5.0], [-1.0, -0.5]])
    params = torch.cat([mean, log_std], dim=1).requires_grad_(True)
    torch.manual_seed(3)
    squashed, log_probs = dist.rsample(params)
    torch.manual_seed(3)
    noise = torch.randn(6, 2)
    exact = params.detach().double().requires_grad_(True)
    expected_squashed, expected = squashed_reference(exact, noise.double(), exact_log_jacobian)
    torch.testing.assert_close(squashed, expected_squashed.float())
    torch.testing.assert_close(log_probs, expected.float(), rtol=1e-5, atol=1e-4)
    usual = squashed_reference(params.detach(), noise)[1]
    torch.testing.assert_close(log_probs[:3], usual[:3], rtol=1e-4, atol=1e-4)
    assert ((usual[3:] - expected[3:].float()).abs() > 3.0).all()  # the usual form loses them in float32
    (grad,) = torch.autograd.grad(log_probs.sum(), params)
    (expected_grad,) = torch.autograd.grad(expected.sum(), exact)
    torch.testing.assert_close(grad, expected_grad.float(), rtol=1e-4, atol=1e-4)


def test_mode_is_the_scaled_tanh_of_the_mean_and_scaling_round_trips():
    dist = SquashedGaussian(ASYMMETRIC)
    low, high = torch.tensor(ASYMMETRIC.low), torch.tensor(ASYMMETRIC.high)
    params = torch.tensor([[0.5, -2.0, 0.3, 1.0], [-30.0, 30.0, -5.0, 0.0], [0.0, 0.0, 2.0, 2.0]])
    expected = low + (torch.tanh(params[:, :2]) + 1) / 2 * (high - low)
    torch.testing.assert_close(dist.mode(params), expected)
    torch.testing.assert_close(dist.mode(params)[1], torch.tensor([-2.0, 1.0]))  # saturated: the bounds
    corners = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0]])
    torch.testing.assert_close(dist.scale(corners), torch.stack([low, high, (low + high) / 2]))
    inside = torch.rand(100, 2) * 2 - 1
    torch.testing.assert_close(dist.unscale(dist.scale(inside)), inside)
    actions = low + torch.rand(100, 2) * (high - low)
    torch.testing.assert_close(dist.scale(dist.unscale(actions)), actions)


def plain_mlp(stack, x: torch.Tensor) -> torch.Tensor:
    """The linear layers of `stack` in order, ReLU (SAC's default activation) after each but the last."""
    linears = [module for module in stack.modules() if isinstance(module, torch.nn.Linear)]
    for linear in linears:
        x = F.linear(x, linear.weight, linear.bias)
        x = torch.relu(x) if linear is not linears[-1] else x
    return x


def actor_params(actor, x: torch.Tensor) -> torch.Tensor:
    mean, log_std = plain_mlp(actor.net, x).chunk(2, dim=-1)
    return torch.cat([mean, log_std.clamp(-20.0, 2.0)], dim=-1)


def twin(critic, x: torch.Tensor, actions: torch.Tensor):
    """Q1 and Q2, each its own MLP (critic i's layers: weights[k][i] [in, out], biases[k][i] [1, out])."""
    xa = torch.cat([x, actions], dim=1)
    out = []
    for i in range(2):
        h = xa
        for k, (weight, bias) in enumerate(zip(critic.weights, critic.biases)):
            h = h @ weight[i] + bias[i]
            h = torch.relu(h) if k < len(critic.weights) - 1 else h
        out.append(h.squeeze(1))
    return tuple(out)


def reference_step(sac: SAC, batch: ReplayBatch, seed: int) -> dict:
    """One SAC step in plain torch on copies of `sac`'s networks, made before its update (the next actions'
    noise drawn first, then the actor's, after torch.manual_seed(seed)): losses, |TD errors|, gradients."""
    actor, critic, target = (copy.deepcopy(net) for net in (sac.model, sac.critic, sac.target))
    log_alpha = sac.log_alpha.detach().clone().requires_grad_(True)
    alpha = log_alpha.detach().exp()
    x, next_x = batch.obs["obs"], batch.next_obs["obs"]
    torch.manual_seed(seed)
    next_noise, noise = torch.randn(len(x), 2), torch.randn(len(x), 2)
    with torch.no_grad():
        next_actions, next_log_probs = squashed_reference(actor_params(actor, next_x), next_noise)
        next_q = torch.minimum(*twin(target, next_x, next_actions)) - alpha * next_log_probs
        targets = batch.returns + batch.discounts * next_q
    low, high = torch.tensor(ASYMMETRIC.low), torch.tensor(ASYMMETRIC.high)
    q1, q2 = twin(critic, x, 2 * (batch.actions - low) / (high - low) - 1)
    critic_loss = 0.5 * (batch.weights * ((q1 - targets).square() + (q2 - targets).square())).mean()
    critic_grads = torch.autograd.grad(critic_loss, list(critic.parameters()))
    squashed, log_probs = squashed_reference(actor_params(actor, x), noise)
    actor_loss = (alpha * log_probs - torch.minimum(*twin(critic, x, squashed))).mean()
    actor_grads = torch.autograd.grad(actor_loss, list(actor.parameters()))
    alpha_loss = -(log_alpha * (log_probs.detach() + sac.target_entropy)).mean()
    (alpha_grad,) = torch.autograd.grad(alpha_loss, [log_alpha])
    grad_norm = torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in critic_grads + actor_grads]))
    stats = {
        "critic_loss": critic_loss,
        "actor_loss": actor_loss,
        "alpha": alpha,
        "entropy": -log_probs.mean(),
        "q_mean": q1.mean(),
        "td_abs_mean": None,
        "grad_norm": grad_norm,
    }
    td_abs = 0.5 * ((q1 - targets).abs() + (q2 - targets).abs()).detach()
    stats["td_abs_mean"] = td_abs.mean()
    return {"stats": stats, "td_abs": td_abs, "critic": critic_grads, "actor": actor_grads, "alpha": alpha_grad}


def assert_grads(module, expected) -> None:
    for (name, param), grad in zip(module.named_parameters(), expected):
        torch.testing.assert_close(param.grad, grad, rtol=1e-4, atol=1e-5, msg=name)


def _eager_random_draws():
    """torch.compile's random draws made as eager torch makes them (the same numbers from the same seed)."""
    import torch._inductor.config

    return torch._inductor.config.patch(fallback_random=True)


@pytest.mark.parametrize("path", ["kernels", "torch", "compile"])
@pytest.mark.parametrize("target_entropy", ["-1", "3"])
def test_one_update_matches_a_plain_torch_sac_step(tmp_path, monkeypatch, path, target_entropy):
    """The critics' gradient is their loss's alone (the actor loss's does not reach their weights), the actor's
    goes through the critics, the temperature's moves alpha down while the entropy is above its target (and up
    below: --target_entropy 3); the |TD errors| and the statistics are the reference's. With the compiled CPU
    kernels, with torch's ops, and with --compile (the losses through torch.compile, its random draws torch's)."""
    if path == "kernels" and kernels.KERNELS is None:
        pytest.skip("the compiled CPU kernels are not built")
    if path == "torch":
        monkeypatch.setattr(kernels, "KERNELS", None)
    if path == "compile":
        import torch._dynamo as dynamo

        dynamo.reset()  # compiled anew here, counted below
        dynamo.utils.counters.clear()
    flags = ["--target_entropy", target_entropy, "--learning_rate", "0.001", "--compile", str(path == "compile")]
    sac = make_sac(sac_plan(tmp_path, *flags))
    batch = sac_batch()
    expected = reference_step(sac, batch, seed=7)
    log_alpha, critic_params, actor_params = (
        sac.log_alpha.item(),
        sac.critic_optimizer.param.detach().clone(),
        sac.optimizer.param.detach().clone(),
    )
    torch.manual_seed(7)
    with _eager_random_draws() if path == "compile" else contextlib.nullcontext():
        result = sac.train(batch)
    td_abs = result.priorities
    assert (result.samples, result.updates, result.skipped_updates) == (200, 1, 0)
    assert_grads(sac.critic, expected["critic"])
    assert_grads(sac.model, expected["actor"])
    torch.testing.assert_close(sac.log_alpha.grad, expected["alpha"])
    for optimizer, before in ((sac.critic_optimizer, critic_params), (sac.optimizer, actor_params)):
        step = 1e-3 * optimizer.grad / (optimizer.grad.abs() + 1e-8)  # Adam's first step
        torch.testing.assert_close(optimizer.param.detach(), before - step, rtol=1e-5, atol=1e-7)
    entropy_above_target = expected["stats"]["entropy"].item() > sac.target_entropy
    assert entropy_above_target == (target_entropy == "-1")
    assert (sac.log_alpha.item() < log_alpha) == entropy_above_target
    assert sac.log_alpha.item() == pytest.approx(log_alpha + (-1e-3 if entropy_above_target else 1e-3), rel=1e-3)
    torch.testing.assert_close(td_abs, expected["td_abs"], rtol=1e-4, atol=1e-5)
    assert result.losses.keys() == expected["stats"].keys()
    for name, value in expected["stats"].items():
        assert result.losses[name] == pytest.approx(value.item(), rel=1e-4, abs=1e-5), name
    if path == "compile":  # the critics' and the actor's losses, each one graph
        assert dynamo.utils.counters["stats"]["unique_graphs"] == 2


def test_the_critics_and_the_temperature_step_at_the_critic_learning_rate(tmp_path):
    """--critic_learning_rate 0.003 beside --learning_rate 0.001: Adam's first step is 0.003 per weight for the
    critics and the temperature, 0.001 for the actor; a linear schedule decays both alike."""
    sac = make_sac(sac_plan(tmp_path, "--learning_rate", "0.001", "--critic_learning_rate", "0.003"))
    log_alpha, critic_params, actor_params = (
        sac.log_alpha.item(),
        sac.critic_optimizer.param.detach().clone(),
        sac.optimizer.param.detach().clone(),
    )
    sac.train(sac_batch())
    for optimizer, before, lr in ((sac.critic_optimizer, critic_params, 3e-3), (sac.optimizer, actor_params, 1e-3)):
        step = lr * optimizer.grad / (optimizer.grad.abs() + 1e-8)  # Adam's first step
        torch.testing.assert_close(optimizer.param.detach(), before - step, rtol=1e-5, atol=1e-7)
    assert abs(sac.log_alpha.item() - log_alpha) == pytest.approx(3e-3, rel=1e-3)
    sac._set_learning_rate(5e-4)  # what --lr_schedule linear sets halfway
    lrs = [opt.param_groups[0]["lr"] for opt in (sac.optimizer, sac.critic_optimizer, sac.alpha_optimizer)]
    assert lrs == pytest.approx([5e-4, 1.5e-3, 1.5e-3])


@pytest.mark.parametrize("period", [1, 2])
def test_the_target_critics_take_a_polyak_step_every_period(tmp_path, period):
    """--target_tau 0.005: every --target_update_period-th update the targets move 0.005 of the way to the
    critics (the target networks' own weights with them); in between they stay."""
    sac = make_sac(sac_plan(tmp_path, "--target_tau", "0.005", "--target_update_period", str(period)))
    assert torch.equal(sac.target_params, sac.critic_params)
    for update in range(1, 5):
        previous = sac.target_params.clone()
        sac.train(sac_batch(seed=update))
        if update % period == 0:
            assert not torch.equal(sac.target_params, previous)
            expected = previous + 0.005 * (sac.critic_params - previous)
            torch.testing.assert_close(sac.target_params, expected, rtol=0.0, atol=1e-7)
        else:
            assert torch.equal(sac.target_params, previous), update
    weights = torch.cat([param.reshape(-1) for param in sac.target.parameters()])
    assert torch.equal(weights, sac.target_params) and not torch.equal(sac.target_params, sac.critic_params)


def test_a_fixed_temperature_stays(tmp_path):
    sac = make_sac(sac_plan(tmp_path, "--alpha", "0.2", "--tune_alpha", "false"))
    actor = sac.params.clone()
    for seed in range(3):
        result = sac.train(sac_batch(seed=seed))
        assert result.losses["alpha"] == pytest.approx(0.2)
    assert sac.log_alpha.item() == pytest.approx(math.log(0.2), abs=1e-7) and not sac.log_alpha.grad.any()
    assert not torch.equal(sac.params, actor)


def test_a_non_finite_batch_skips_the_whole_update(tmp_path):
    """A NaN return: the actor, the critics, their targets, the temperature and the update count stay, the
    TD errors are 0, skipped_updates 1; the next finite batch trains as if nothing had happened."""
    sac = make_sac(sac_plan(tmp_path, "--target_update_period", "1"))
    batch = sac_batch()
    batch.returns[5] = float("nan")
    before = [t.detach().clone() for t in (sac.params, sac.critic_params, sac.target_params, sac.log_alpha)]
    result = sac.train(batch)
    td_abs = result.priorities
    assert (result.samples, result.updates, result.skipped_updates) == (0, 0, 1)
    assert torch.equal(td_abs, torch.zeros(200)) and sac.num_updates == 0
    after = (sac.params, sac.critic_params, sac.target_params, sac.log_alpha.detach())
    assert all(torch.equal(old, new) for old, new in zip(before, after))
    result = sac.train(sac_batch(seed=1))
    td_abs = result.priorities
    assert (result.updates, result.skipped_updates) == (1, 0) and torch.isfinite(td_abs).all()
    assert all(torch.isfinite(t).all() for t in (sac.params, sac.critic_params, sac.target_params, sac.log_alpha))


def test_a_loaded_state_acts_and_updates_identically(tmp_path):
    """A fresh SAC (other weights) loads another's state() through the checkpoint's bytes: the same greedy and
    sampled actions, then the same updates (optimizer moments, temperature, the target period's phase, the
    input normalizer's statistics)."""
    plan = sac_plan(tmp_path, "--normalize_input", "true", "--target_update_period", "2")
    trained, fresh = make_sac(plan, seed=0), make_sac(plan, seed=1)
    for seed in range(3):
        trained.observe({"obs": sac_batch(seed=seed).obs["obs"].numpy() * 2 + 1})  # the statistics move
        trained.train(sac_batch(seed=seed))
    saved = io.BytesIO()
    torch.save(trained.state(), saved)
    assert not torch.equal(fresh.params, trained.params)
    fresh.load(torch.load(io.BytesIO(saved.getvalue()), weights_only=True), "checkpoint")
    obs = sac_batch(seed=9).obs
    assert torch.equal(fresh.model.greedy(obs)[0], trained.model.greedy(obs)[0])
    sampled = []
    for sac in (trained, fresh):
        torch.manual_seed(3)
        sampled.append(sac.model.sample(obs)[:2])
    assert all(torch.equal(a, b) for a, b in zip(*sampled))
    for seed in (4, 5):
        results = []
        for sac in (trained, fresh):
            torch.manual_seed(seed)
            results.append(sac.train(sac_batch(seed=seed)))
        assert results[0].losses == results[1].losses and torch.equal(results[0].priorities, results[1].priorities)
    for name in ("params", "critic_params", "target_params", "log_alpha", "num_updates"):
        assert torch.equal(torch.as_tensor(getattr(fresh, name)), torch.as_tensor(getattr(trained, name))), name


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--alpha", "0"], ["--alpha", "positive"]),
        (["--alpha", "-1"], ["--alpha", "positive"]),
        (["--alpha", "nan"], ["--alpha"]),
        (["--target_entropy", "nan"], ["--target_entropy", "finite"]),
        (["--target_tau", "0"], ["--target_tau", "(0, 1]"]),
        (["--critic_learning_rate", "-0.001"], ["--critic_learning_rate", ">= 0"]),
        (["--tune_alpha", "maybe"], ["--tune_alpha", "true or false"]),
        (["--env", "CartPole-v1"], ["--algo sac", "Box", "--algo ppo"]),
        (["--env", "toy_envs:UnboundedActionEnv"], ["--algo sac", "bounds", "--algo ppo"]),
        (["--rnn", "gru"], ["--rnn gru", "--algo sac"]),
        (["--normalize_returns", "true"], ["--normalize_returns", "--algo sac"]),
        (["--num_policies", "2"], ["--num_policies", "--algo sac"]),
    ],
)
def test_bad_sac_settings_are_one_line_and_touch_nothing(tmp_path, capsys, flags, words):
    base = ["--algo", "sac", "--env", "Pendulum-v1", "--mode", "serial"]
    assert_refused_untouched(base + flags, tmp_path, capsys, words)


def test_normalized_inputs_follow_the_observed_steps_and_the_critics_see_them(tmp_path):
    """--normalize_input true with sac: accepted; the actor's running statistics merge the observations of the env
    steps inserted (observe), each once, and an update leaves them as they are; the critics (their targets too)
    take the actor's normalized inputs."""
    sac = make_sac(sac_plan(tmp_path, "--normalize_input", "true", "--replay_ratio", "2"))
    normalizer = sac.model.normalizer
    seen = []
    for net in (sac.critic, sac.target):
        forward = net.forward
        net.forward = lambda x, actions, forward=forward: seen.append(x.detach().clone()) or forward(x, actions)
    batch = sac_batch()
    batch.obs["obs"] = batch.obs["obs"] * 5 + 3
    raw = batch.obs["obs"]
    sac.observe({"obs": raw[:120].numpy()})
    sac.observe({"obs": raw[120:].numpy()})
    statistics = [tensor.clone() for tensor in (normalizer.mean, normalizer.var, normalizer.count)]
    sac.train(batch)
    assert all(torch.equal(a, b) for a, b in zip(statistics, (normalizer.mean, normalizer.var, normalizer.count)))
    torch.testing.assert_close(normalizer.mean, raw.mean(0), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(normalizer.var, raw.var(0, unbiased=False), rtol=1e-3, atol=1e-3)
    normalized, next_normalized = (
        (obs - normalizer.mean) / normalizer.var.add(1e-8).sqrt() for obs in (raw, batch.next_obs["obs"])
    )
    assert len(seen) == 3  # the target critics, the critics' loss, the actor's loss
    torch.testing.assert_close(seen[0], next_normalized.clamp(-10, 10))
    torch.testing.assert_close(seen[1], normalized)
    torch.testing.assert_close(seen[2], normalized)
    torch.testing.assert_close(sac.model.inputs(batch.obs), normalized)
