"""DQN's update (--algo dqn): the compiled direct-gradient step against autograd, dueling and layer-normalized
networks, the target network's copies and Polyak steps, targets that never bootstrap from an illegal action, a
serial run on a masked env that never takes one, and enjoy.py and export of DQN and PQN checkpoints (greedy:
the argmax of the Q-values)."""

import os

import numpy as np
import pytest
import torch
from conftest import REPO, enjoy_episodes, read_json

from sf_engine.algo.base import TrainingHooks
from sf_engine.algo.batch import ReplayBatch
from sf_engine.algo.dqn.learning import DQN
from sf_engine.model import kernels
from sf_engine.run.plan import build_plan

needs_kernels = pytest.mark.skipif(kernels.KERNELS is None, reason="the compiled CPU kernels are not built")

HOOKS = TrainingHooks(env_steps=lambda: 0, beat=lambda: None, stopping=lambda: False, elapsed_sec=lambda: 0.0)
MASKED = "toy_envs:MaskedChoiceEnv"
SMALL = ["--mode", "serial", "--num_workers", "1", "--num_envs_per_worker", "8", "--hidden_size", "32"]


def dqn_plan(tmp_path, *flags, env="CartPole-v1"):
    return build_plan(["--algo", "dqn", "--env", env, "--train_dir", str(tmp_path)] + SMALL + list(flags))


def make_dqn(plan, seed: int = 0) -> DQN:
    torch.manual_seed(seed)
    return DQN(plan.cfg, plan.spec, torch.device("cpu"), HOOKS)


def observations(spec, rows: int, rng) -> dict:
    """Vector observations of `spec` (scaled up, so that TD errors reach both sides of the Huber loss's
    kink); an action mask, where the spec has one, with every action legal."""
    return {
        key: torch.ones(rows, *shape)
        if key == "action_mask"
        else torch.from_numpy(rng.normal(size=(rows, *shape)) * 3).float()
        for key, shape, _ in spec.obs
    }


def replay_batch(spec, rows: int = 300, seed: int = 0) -> ReplayBatch:
    """A minibatch as the replay buffer gives it: float observations, a fifth of them terminal (discount 0),
    importance weights in [0.1, 1)."""
    rng = np.random.default_rng(seed)
    obs, next_obs = observations(spec, rows, rng), observations(spec, rows, rng)
    terminal = rng.random(rows) < 0.2
    return ReplayBatch(
        obs=obs,
        actions=torch.from_numpy(rng.integers(0, spec.action.nvec[0], rows)),
        returns=torch.from_numpy(rng.normal(size=rows).astype(np.float32) * 3),
        discounts=torch.from_numpy(np.where(terminal, 0.0, 0.99**3).astype(np.float32)),
        next_obs=next_obs,
        weights=torch.from_numpy(rng.uniform(0.1, 1.0, rows).astype(np.float32)),
    )


@needs_kernels
@pytest.mark.parametrize("layer_norm", ["false", "true"])
def test_direct_gradient_update_matches_autograd(tmp_path, monkeypatch, layer_norm):
    """Two DQNs from the same seed take one update on the same batch, one through the compiled forward and
    backward (QNetwork.q_loss_gradients, the layer norms' included), one through torch's ops and autograd
    (q_values, torch's Huber loss weighted by the importance weights): the same gradient, weights after the
    step, loss statistics and TD errors."""
    # one MLP stack: what the compiled path runs; a Huber threshold the TD errors cross (classic control's is 10)
    plan = dqn_plan(tmp_path, "--layer_norm", layer_norm, "--huber_delta", "1")
    direct, reference = make_dqn(plan), make_dqn(plan)
    assert torch.equal(direct.params, reference.params)
    batch = replay_batch(plan.spec)
    assert direct.model.direct_gradients(batch.obs)
    calls = []
    compiled = direct.model.q_loss_gradients
    direct.model.q_loss_gradients = lambda obs, loss_and_grad: calls.append(1) or compiled(obs, loss_and_grad)
    before = direct.params.clone()

    ours = direct.train(batch)
    our_td = ours.priorities
    assert calls == [1]
    monkeypatch.setattr(kernels, "use_kernels", lambda x: False)  # the reference: torch's ops, autograd
    assert not reference.model.direct_gradients(batch.obs)
    theirs = reference.train(batch)
    their_td = theirs.priorities
    assert (ours.samples, ours.updates, ours.skipped_updates) == (theirs.samples, theirs.updates, 0) == (300, 1, 0)
    delta = plan.cfg.q.huber_delta
    assert (their_td > delta).any() and (their_td < delta).any()  # both sides of the Huber loss
    assert direct.optimizer.grad.abs().sum() > 0
    torch.testing.assert_close(direct.optimizer.grad, reference.optimizer.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(direct.params, reference.params, rtol=1e-4, atol=1e-6)
    assert not torch.equal(direct.params, before)
    torch.testing.assert_close(our_td, their_td, rtol=1e-5, atol=1e-5)
    assert ours.losses.keys() == theirs.losses.keys() == {"q_loss", "q_mean", "td_abs_mean", "grad_norm"}
    for name, value in theirs.losses.items():
        assert ours.losses[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name


@pytest.mark.parametrize(
    "flags",
    [["--dueling", "true"], ["--dueling", "true", "--layer_norm", "true"]],
    ids=["dueling", "dueling_layer_norm"],
)
def test_dueling_networks_train_through_autograd(tmp_path, flags):
    """One update of a network the compiled stack does not cover (two heads) runs through autograd and moves
    the weights, both streams'."""
    plan = dqn_plan(tmp_path, *flags)
    dqn = make_dqn(plan)
    batch = replay_batch(plan.spec)
    assert dqn.model.value_head is not None
    assert not dqn.model.direct_gradients(batch.obs)  # no single compiled stack: the autograd path
    before = dqn.params.clone()
    result = dqn.train(batch)
    td_abs = result.priorities
    assert (result.samples, result.updates, result.skipped_updates) == (300, 1, 0)
    assert all(np.isfinite(value) for value in result.losses.values()) and result.losses["grad_norm"] > 0
    assert td_abs.shape == (300,) and torch.isfinite(td_abs).all() and td_abs.sum() > 0
    assert not torch.equal(dqn.params, before)
    assert dqn.model.value_head.weight.grad.abs().sum() > 0 and dqn.model.q_head.weight.grad.abs().sum() > 0


def test_the_target_network_is_copied_every_period(tmp_path):
    """--target_update_period 3 --target_tau 1: the target equals the online network right after updates 3
    and 6 (and at the start), and lags behind it after the others; the target network's Q-values are those
    of the online network at the last copy."""
    plan = dqn_plan(tmp_path, "--target_update_period", "3", "--target_tau", "1", "--learning_rate", "0.01")
    dqn, probe = make_dqn(plan), replay_batch(plan.spec, seed=99).next_obs
    assert torch.equal(dqn.target_params, dqn.params)
    for update in range(1, 8):
        previous = dqn.target_params.clone()
        dqn.train(replay_batch(plan.spec, seed=update))
        if update % 3 == 0:
            assert torch.equal(dqn.target_params, dqn.params), update
            with torch.no_grad():
                copied_q = dqn.model.q_values(probe)
        else:
            assert torch.equal(dqn.target_params, previous), update
            assert not torch.equal(dqn.target_params, dqn.params), update
    with torch.no_grad():
        torch.testing.assert_close(dqn.target.q_values(probe), copied_q)
        assert not torch.allclose(dqn.model.q_values(probe), copied_q)


def test_the_target_follows_replaced_weights_and_never_takes_non_finite_ones(tmp_path):
    """A restarted learner's last published weights replace the online ones: the target network restarts from
    them (not from the random ones built at start). A copy due while the weights hold a NaN is not made."""
    # a constant step: the infinite one set below stays (a schedule would set its own at the first update)
    plan = dqn_plan(tmp_path, "--target_update_period", "1", "--target_tau", "1", "--lr_schedule", "constant")
    dqn = make_dqn(plan)
    dqn.params.copy_(torch.randn_like(dqn.params))  # what _recover does with the last published weights
    dqn.weights_replaced()
    assert torch.equal(dqn.target_params, dqn.params)
    before = dqn.target_params.clone()
    dqn.optimizer.param_groups[0]["lr"] = float("inf")  # the step leaves non-finite weights
    dqn.train(replay_batch(plan.spec, seed=5))
    assert not torch.isfinite(dqn.params).all()
    assert torch.equal(dqn.target_params, before)


def test_a_polyak_step_moves_the_target_half_way(tmp_path):
    plan = dqn_plan(tmp_path, "--target_update_period", "3", "--target_tau", "0.5", "--learning_rate", "0.01")
    dqn = make_dqn(plan)
    start = dqn.target_params.clone()
    for update in range(1, 4):
        dqn.train(replay_batch(plan.spec, seed=update))
        if update < 3:
            assert torch.equal(dqn.target_params, start)
    assert not torch.equal(dqn.params, start)
    torch.testing.assert_close(dqn.target_params, start + 0.5 * (dqn.params - start))


@pytest.mark.parametrize("double_q", ["true", "false"])
def test_targets_never_bootstrap_from_an_illegal_action(tmp_path, double_q):
    """MaskedChoiceEnv: action 2 has a huge Q-value in both networks; where the next observation's mask makes
    it illegal, the target bootstraps from the legal actions only (double DQN's online argmax and plain DQN's
    target maximum alike), where it is legal, from it; the value is the target network's."""
    plan = dqn_plan(tmp_path, "--double_q", double_q, env=MASKED)
    dqn = make_dqn(plan)
    assert dqn.model.masked
    batch = replay_batch(plan.spec)
    rng = np.random.default_rng(5)
    mask = (rng.random((300, 5)) < 0.5).astype(np.float32)
    mask[np.arange(300), rng.choice([0, 1, 3, 4], 300)] = 1.0
    mask[:150, 2] = 0.0  # illegal in the first half, legal in the second
    mask[150:, 2] = 1.0
    batch.next_obs["action_mask"] = torch.from_numpy(mask)
    batch.discounts = torch.ones(300)
    dqn.target_params.add_(torch.randn_like(dqn.target_params) * 0.1)  # the target's values are not the online's
    with torch.no_grad():
        dqn.target.q_head.bias[2] = 1e6
        dqn.model.q_head.bias[2] = 1e6
        next_target = dqn.target.q_values(batch.next_obs)
        next_online = dqn.model.q_values(batch.next_obs)
    legal = torch.from_numpy(mask).bool()
    targets = dqn._targets(batch)
    assert (targets[150:] > 1e5).all()  # a legal action 2 is bootstrapped from
    assert (targets[:150].abs() < 1e3).all()
    if double_q == "true":
        picked = next_online.masked_fill(~legal, -torch.inf).argmax(dim=1, keepdim=True)
        expected = batch.returns + next_target.gather(1, picked).squeeze(1)
    else:
        expected = batch.returns + next_target.masked_fill(~legal, -torch.inf).amax(dim=1)
    torch.testing.assert_close(targets, expected)


@pytest.mark.e2e
def test_a_serial_dqn_run_on_a_masked_env_never_takes_an_illegal_action(tmp_path, shm_dir, monkeypatch):
    """Every step of every env of the run is checked (serial mode steps the envs in this process), whether a
    row explores or acts greedily; and the Q-network learns to take the action the observation shows (a
    uniform choice among the legal ones scores about 5.2 of 10)."""
    import toy_envs

    from sf_engine.run.runner import run

    taken = {"steps": 0, "illegal": 0}
    step = toy_envs.MaskedChoiceEnv.step

    def counted_step(env, action):
        taken["steps"] += 1
        taken["illegal"] += int(env.mask[int(action)] == 0)
        return step(env, action)

    monkeypatch.setattr(toy_envs.MaskedChoiceEnv, "step", counted_step)
    flags = ["--experiment", "masked", "--shm_dir", shm_dir, "--num_envs_per_worker", "16", "--hidden_size", "64"]
    plan = dqn_plan(tmp_path, *flags, "--train_for_env_steps", "6000", "--learning_starts", "500", env=MASKED)
    assert run(plan) == 0
    summary = read_json(tmp_path / "masked" / "summary.json")
    assert taken["steps"] > 5000 and taken["illegal"] == 0, taken  # (every 11th env step is a reset)
    assert summary["episode_extra_stats"]["illegal"] == 0.0 and summary["learner_version"] > 10, summary
    assert summary["episode_return_mean"] > 8.0, summary
    assert os.listdir(shm_dir) == []


@pytest.mark.e2e
@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
@pytest.mark.parametrize(
    "algo, flags",
    [
        ("dqn", ["--train_for_env_steps", "3000", "--learning_starts", "500"]),
        ("pqn", ["--train_for_env_steps", "6000", "--batch_size", "256"]),
    ],
)
def test_enjoy_and_export_of_a_q_network_act_greedily(tmp_path, shm_dir, capsys, algo, flags):
    """A tiny CartPole run of --algo dqn / pqn: enjoy.py replays it greedily (the same episodes with and without
    --deterministic), and the exported ONNX and TorchScript files give the argmax of the model's Q-values (and
    their maximum as the value)."""
    import onnxruntime

    from sf_engine.model.q_network import QNetwork
    from sf_engine.play.export import main as export_main
    from sf_engine.play.loading import load_experiment, load_policy, resolve_checkpoint
    from sf_engine.run.runner import run

    where = ["--train_dir", str(tmp_path), "--experiment", algo]
    plan = build_plan(["--algo", algo, "--shm_dir", shm_dir] + where + SMALL + flags)
    assert run(plan) == 0
    assert read_json(tmp_path / algo / "summary.json")["learner_version"] > 0  # a trained network
    capsys.readouterr()
    assert enjoy_episodes(capsys, *where) == enjoy_episodes(capsys, *where, "--deterministic")

    assert export_main(where) == 0
    cfg, spec, exp_dir = load_experiment(str(tmp_path), algo)
    export_dir = tmp_path / algo / "export"
    model = load_policy(cfg, spec, resolve_checkpoint(exp_dir, algo, "latest"), "cpu")
    assert isinstance(model, QNetwork)
    rng = np.random.default_rng(0)
    obs = (rng.normal(size=(512, 4)) * [2.0, 2.0, 0.2, 2.0]).astype(np.float32)  # CartPole's states and beyond
    with torch.no_grad():
        q = model.q_values({"obs": torch.from_numpy(obs)})
    greedy = q.argmax(dim=1).numpy()
    assert 0 < greedy.mean() < 1  # both actions: the comparison means something
    scripted = torch.jit.load(str(export_dir / "policy.torchscript.pt"))
    with torch.no_grad():
        script_action, script_value = scripted(torch.from_numpy(obs))
    onnx_action, onnx_value = onnxruntime.InferenceSession(str(export_dir / "policy.onnx")).run(None, {"obs": obs})
    assert (script_action.numpy() == greedy).all() and (onnx_action == greedy).all()
    np.testing.assert_allclose(script_value.numpy(), q.max(dim=1).values.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(onnx_value, q.max(dim=1).values.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_an_exported_dueling_q_network_keeps_to_the_legal_actions(tmp_path):
    """A dueling, layer-normalized Q-network of the masked env, its illegal action 2 the highest raw Q-value:
    the exported files take the mask as an input and choose the legal argmax, as the model does."""
    import onnxruntime

    from sf_engine.config.groups import ModelConfig
    from sf_engine.config.value import QConfig
    from sf_engine.envs import probe_env_spec
    from sf_engine.model.q_network import QNetwork
    from sf_engine.model.shape import resolve_model_config
    from sf_engine.play.export import export

    spec = probe_env_spec(MASKED, "auto")
    torch.manual_seed(0)
    model = QNetwork(
        spec, resolve_model_config(ModelConfig(hidden_size=16), spec), QConfig(dueling=True, layer_norm=True)
    )
    with torch.no_grad():
        model.q_head.bias[2] = 100.0
    rng = np.random.default_rng(0)
    mask = (rng.random((64, 5)) < 0.6).astype(np.float32)
    mask[np.arange(64), rng.choice([0, 1, 3, 4], 64)] = 1.0
    mask[:32, 2], mask[32:, 2] = 0.0, 1.0
    obs = {"action_mask": mask, "obs": rng.normal(size=(64, 5)).astype(np.float32)}
    with torch.no_grad():
        q, values = model({key: torch.from_numpy(value) for key, value in obs.items()})
    greedy = q.argmax(dim=1).numpy()
    assert (greedy[32:] == 2).all() and (greedy[:32] != 2).all() and mask[np.arange(64), greedy].all()
    export(model, spec, str(tmp_path))
    onnx_action, onnx_value = onnxruntime.InferenceSession(str(tmp_path / "policy.onnx")).run(None, obs)
    with torch.no_grad():
        script_action, script_value = torch.jit.load(str(tmp_path / "policy.torchscript.pt"))(
            *(torch.from_numpy(obs[key]) for key, _, _ in spec.obs)
        )
    assert (onnx_action == greedy).all() and (script_action.numpy() == greedy).all()
    np.testing.assert_allclose(onnx_value, values.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(script_value.numpy(), values.numpy(), rtol=1e-5, atol=1e-5)


def _image_q_network(shape: tuple, encoder: str):
    from sf_engine.config.groups import ModelConfig
    from sf_engine.config.value import QConfig
    from sf_engine.envs import ActionSpec, EnvSpec
    from sf_engine.model.q_network import QNetwork
    from sf_engine.model.shape import resolve_model_config

    spec = EnvSpec(obs=(("obs", shape, "uint8"),), action=ActionSpec("discrete", nvec=(6,), start=(0,)))
    torch.manual_seed(0)
    return QNetwork(spec, resolve_model_config(ModelConfig(encoder=encoder), spec), QConfig(layer_norm=True))


def test_a_layer_normalized_image_q_network_has_a_norm_after_every_hidden_layer():
    """--layer_norm on images (PQN's, as its paper and CleanRL's pqn_atari_envpool.py have it): a LayerNorm over
    [C, H, W] after each convolution, and one after the 512 units, each before the ReLU. The engine's own input
    path (uint8 frames through the compiled pass, channels-last convolutions) gives the Q-values of that network
    written out with torch's functions."""
    import torch.nn.functional as F
    from torch import nn

    model = _image_q_network((4, 84, 84), "nature_cnn")
    cnn = model.encoder.nets["obs"]
    norms = [module for module in cnn.modules() if isinstance(module, nn.LayerNorm)]
    assert [tuple(norm.normalized_shape) for norm in norms] == [(32, 20, 20), (64, 9, 9), (64, 7, 7), (512,)]
    with torch.no_grad():
        for norm in norms:  # not the identity they start as
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    frames = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    x = frames.float() / 255.0
    convs = [module for module in cnn.modules() if isinstance(module, nn.Conv2d)]
    with torch.no_grad():
        for conv, norm in zip(convs, norms):
            x = F.conv2d(x, conv.weight.contiguous(), conv.bias, conv.stride)
            x = F.relu(F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias))
        linear = cnn.fc[0]
        x = F.relu(
            F.layer_norm(F.linear(x.flatten(1), linear.weight, linear.bias), (512,), norms[3].weight, norms[3].bias)
        )
        torch.testing.assert_close(model.q_values({"obs": frames}), model.q_head(x), rtol=1e-4, atol=1e-4)

    impala = _image_q_network((64, 64, 3), "impala_cnn").encoder.nets["obs"]  # [H, W, C] frames
    impala_convs = [module for module in impala.modules() if isinstance(module, nn.Conv2d)]
    assert sum(isinstance(module, nn.LayerNorm) for module in impala.modules()) == len(impala_convs) + 1 == 16
    simple = _image_q_network((3, 72, 128), "convnet_simple").encoder.nets["obs"]
    assert sum(isinstance(module, nn.LayerNorm) for module in simple.modules()) == 4
    q = _image_q_network((64, 64, 3), "impala_cnn").q_values({"obs": torch.zeros(2, 64, 64, 3, dtype=torch.uint8)})
    assert q.shape == (2, 6) and bool(q.isfinite().all())


def test_the_held_share_counts_the_evaluations_after_the_first_at_the_threshold_within_the_window():
    """docs/value-based.md's hold of DQN on CartPole: of the greedy evaluations after the first at 475 or more (it
    excluded), within 3 minutes of it, the share at 475 or more (perf/common.py's held_share)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("perf_common", os.path.join(REPO, "perf", "common.py"))
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    evaluations = [(10, 1, 200.0), (20, 2, 480.0), (30, 3, 500.0), (40, 4, 107.0), (50, 5, 475.0), (210, 9, 90.0)]
    assert common.held_share(evaluations, 475.0, window_sec=180.0) == 0.667  # 500, 107, 475: 90 came too late
    assert common.held_share(evaluations, 475.0) == 0.5
    assert common.held_share(evaluations[:1], 475.0) is None  # never reached
    assert common.held_share(evaluations[:2], 475.0) is None  # reached at the last evaluation: nothing to hold
