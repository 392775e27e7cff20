"""QR-DQN (--algo qrdqn): the quantile Huber loss against a plain-torch reference written pair by pair, one update
against the same maths by hand (targets from the target network's quantiles at the best next action, the gradient
step, the priorities), its acting (epsilon-greedy on the quantiles' mean when acting for training, greedy
otherwise), and a serial run that learns CartPole."""

import os

import numpy as np
import pytest
import torch
from conftest import read_json, run_train
from test_dqn import HOOKS, replay_batch

from sf_engine.algo.qrdqn.learning import QRDQN, quantile_huber_loss
from sf_engine.model.acting import GREEDY, PLAYING, ActContext
from sf_engine.run.plan import build_plan


def _reference_loss(quantiles, targets, taus, kappa) -> torch.Tensor:
    """Dabney et al.'s loss, one (sample, i, j) at a time: sum_i mean_j |tau_i - 1{u < 0}| L_kappa(u) / kappa."""
    out = []
    for b in range(quantiles.shape[0]):
        total = 0.0
        for i in range(quantiles.shape[1]):
            terms = []
            for j in range(targets.shape[1]):
                u = targets[b, j] - quantiles[b, i]
                huber = 0.5 * u * u if abs(u) <= kappa else kappa * (abs(u) - 0.5 * kappa)
                terms.append(abs(taus[i] - (1.0 if u < 0 else 0.0)) * huber / kappa)
            total = total + sum(terms) / len(terms)
        out.append(total)
    return torch.stack(out)


@pytest.mark.parametrize("kappa", [1.0, 0.3])
def test_the_quantile_huber_loss_is_the_papers(kappa):
    generator = torch.Generator().manual_seed(0)
    quantiles = torch.randn(4, 5, generator=generator, dtype=torch.float64) * 2
    targets = torch.randn(4, 6, generator=generator, dtype=torch.float64) * 2
    taus = (torch.arange(5, dtype=torch.float64) + 0.5) / 5
    torch.testing.assert_close(
        quantile_huber_loss(quantiles, targets, taus, kappa), _reference_loss(quantiles, targets, taus, kappa)
    )
    # its gradient moves each quantile toward its own fraction of the targets: from 0, the low quantiles of targets
    # spread over [-10, 10] go down (a positive gradient), the high ones up
    theta = torch.zeros(1, 5, requires_grad=True)
    quantile_huber_loss(theta, torch.linspace(-10, 10, 101).unsqueeze(0), taus.float(), kappa).sum().backward()
    assert (theta.grad[0, :2] > 0).all() and (theta.grad[0, 3:] < 0).all()


def _plan(tmp_path, *flags):
    base = ["--algo", "qrdqn", "--env", "CartPole-v1", "--train_dir", str(tmp_path), "--mode", "serial"]
    return build_plan(base + ["--num_workers", "1", "--num_envs_per_worker", "8", "--num_quantiles", "7", *flags])


@pytest.mark.parametrize("double_q", ["true", "false"])
def test_one_update_is_the_quantile_regression_step_by_hand(tmp_path, double_q):
    plan = _plan(tmp_path, "--double_q", double_q, "--max_grad_norm", "0", "--target_update_period", "1")
    torch.manual_seed(0)
    algorithm = QRDQN(plan.cfg, plan.spec, torch.device("cpu"), HOOKS)
    algorithm.target_params.add_(0.1 * torch.randn_like(algorithm.target_params))  # a target apart from the online
    batch = replay_batch(plan.spec, rows=32)
    model, target = algorithm.model, algorithm.target
    rows = torch.arange(32)
    with torch.no_grad():
        next_target = target.quantiles(batch.next_obs)
        chooser = model.quantiles(batch.next_obs) if double_q == "true" else next_target
        targets = batch.returns[:, None] + batch.discounts[:, None] * next_target[rows, chooser.mean(2).argmax(1)]
    reference = type(model)(plan.spec, plan.cfg)  # the same weights, trained by plain torch
    reference.load_state_dict(model.state_dict())
    quantiles = reference.quantiles(batch.obs)[rows, batch.actions]
    loss = (batch.weights * _reference_loss(quantiles, targets, algorithm.taus, 1.0)).mean()
    optimizer = torch.optim.Adam(reference.parameters(), lr=plan.cfg.learner.learning_rate, eps=1e-5)
    loss.backward()
    optimizer.step()
    result = algorithm.train(batch)
    assert result.updates == 1 and result.samples == 32
    assert result.losses["quantile_loss"] == pytest.approx(loss.item(), rel=1e-5)
    torch.testing.assert_close(result.priorities, (targets.mean(1) - quantiles.detach().mean(1)).abs())
    trained = dict(model.named_parameters())
    for name, p in reference.named_parameters():
        torch.testing.assert_close(trained[name], p, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(algorithm.target_params, algorithm.params)  # --target_update_period 1: a copy


def test_it_acts_epsilon_greedy_on_the_quantiles_mean_only_for_training(tmp_path):
    plan = _plan(tmp_path, "--epsilon_start", "1.0", "--epsilon_end", "1.0")
    algorithm = QRDQN(plan.cfg, plan.spec, torch.device("cpu"), HOOKS)
    net, obs = algorithm.model, {"obs": torch.randn(2000, 4)}
    greedy = net.quantiles(obs).mean(2).argmax(1)
    assert torch.equal(net.act(obs, None, GREEDY).actions, greedy)
    assert torch.equal(net.act(obs, None, PLAYING).actions, greedy)
    explored = net.act(obs, None, ActContext(training=True, rows=np.zeros(2000, np.int64), num_rows=8))
    assert 0.4 < (explored.actions != greedy).float().mean() < 0.6  # epsilon 1: a uniform action of two
    torch.testing.assert_close(explored.log_probs, torch.full((2000,), float(np.log(0.5))))


@pytest.mark.e2e
def test_qrdqn_learns_cartpole_in_serial_mode(tmp_path, shm_dir):
    """From about 10 (the untrained greedy policy) to a greedy evaluation above 150 within 60,000 env steps at its
    defaults for classic control (~40 s of a 2-core machine; greedy 500 seen by 120,000 env steps in async mode)."""
    result = run_train(
        ["--algo", "qrdqn", "--env", "CartPole-v1", "--mode", "serial", "--train_for_env_steps", "60000"]
        + ["--eval_every_sec", "2", "--eval_episodes", "5", "--experiment", "qrdqn", "--shm_dir", shm_dir],
        tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_json(tmp_path / "qrdqn" / "summary.json")
    assert summary["algo"] == "qrdqn" and summary["updates_skipped_non_finite"] == 0
    assert summary["eval_return_best"] > 150, summary["eval_return_best"]
    assert os.listdir(shm_dir) == []
