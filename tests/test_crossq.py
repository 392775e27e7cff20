"""CrossQ (--algo crossq): batch renormalization against torch's batch norm and the renormalization written out, the
critics' one batch of replayed and next steps (no target networks), one update's critic loss against the same
maths in plain torch, its acting, and a serial run that learns Pendulum."""

import copy
import math
import os

import pytest
import torch
import torch.nn.functional as F
from conftest import read_json, run_train
from test_sac_runs import PENDULUM

from sf_engine.algo.base import TrainingHooks
from sf_engine.algo.batch import ReplayBatch
from sf_engine.algo.crossq.learning import BatchRenorm, CrossQ
from sf_engine.config.groups import ConfigError
from sf_engine.model.acting import GREEDY, ActContext
from sf_engine.run.plan import build_plan

HOOKS = TrainingHooks(env_steps=lambda: 0, beat=lambda: None, stopping=lambda: False, elapsed_sec=lambda: 0.0)


def test_batch_renorm_is_batch_norm_in_its_warm_up_then_corrected_toward_the_running_statistics():
    torch.manual_seed(0)
    norm = BatchRenorm((5,), momentum=0.1, warmup_steps=2, r_max=1.5, d_max=0.5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
        norm.bias.uniform_(-1.0, 1.0)
    means, variances = [], []
    for step in range(4):
        x = torch.randn(64, 5) * (1 + step) + step
        running_mean, running_var = norm.running_mean.clone(), norm.running_var.clone()
        out = norm(x, batch_stats=True)
        mean, var = x.mean(0), x.var(0, unbiased=False)
        if step < 2:  # the warm-up: torch's batch norm over the batch
            expected = F.batch_norm(x, None, None, norm.weight, norm.bias, training=True, eps=1e-3)
        else:
            running_std = (running_var + 1e-3).sqrt()
            r = ((var + 1e-3).sqrt() / running_std).clamp(1 / 1.5, 1.5)
            d = ((mean - running_mean) / running_std).clamp(-0.5, 0.5)
            expected = norm.weight * ((x - mean) / (var + 1e-3).sqrt() * r + d) + norm.bias
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(norm.running_mean, running_mean + 0.1 * (mean - running_mean))
        torch.testing.assert_close(norm.running_var, running_var + 0.1 * (var - running_var))
        means.append(mean)
        variances.append(var)
    x = torch.randn(3, 5)
    running = (x - norm.running_mean) / (norm.running_var + 1e-3).sqrt() * norm.weight + norm.bias
    torch.testing.assert_close(norm(x, batch_stats=False), running)  # acting: the running statistics only
    assert float(norm.steps) == 4


def _plan(tmp_path, *flags):
    """A small CrossQ's plan on Pendulum, eager unless `flags` say --compile (its default)."""
    base = ["--algo", "crossq", "--env", "Pendulum-v1", "--train_dir", str(tmp_path), "--mode", "serial"]
    base += [] if "--compile" in flags else ["--compile", "false"]
    return build_plan(base + ["--num_workers", "1", "--critic_hidden_size", "32", "--hidden_size", "16", *flags])


def test_it_compiles_by_default_and_without_a_compiler_says_so_in_one_line(tmp_path, monkeypatch):
    """--compile is CrossQ's default (not SAC's); where torch.compile would find no C++ compiler the plan refuses it
    in one line naming the way out, before anything starts."""
    assert build_plan(["--algo", "crossq", "--env", "Pendulum-v1", "--train_dir", str(tmp_path)]).cfg.run.compile
    assert not build_plan(["--algo", "sac", "--env", "Pendulum-v1", "--train_dir", str(tmp_path)]).cfg.run.compile
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(ConfigError, match=r"^--compile: .*C\+\+ compiler.*pass --compile false$"):
        build_plan(["--algo", "crossq", "--env", "Pendulum-v1", "--train_dir", str(tmp_path)])
    assert not build_plan(
        ["--algo", "crossq", "--env", "Pendulum-v1", "--train_dir", str(tmp_path), "--compile", "false"]
    ).cfg.run.compile
    assert os.listdir(tmp_path) == []


def _batch(rows: int = 64) -> ReplayBatch:
    generator = torch.Generator().manual_seed(1)
    obs = lambda: {"obs": torch.randn(rows, 3, generator=generator)}  # noqa: E731
    return ReplayBatch(
        obs=obs(),
        actions=torch.rand(rows, 1, generator=generator) * 4 - 2,
        returns=torch.randn(rows, generator=generator),
        discounts=torch.full((rows,), 0.99),
        next_obs=obs(),
        weights=torch.rand(rows, generator=generator) + 0.5,
    )


def test_one_update_trains_the_critics_on_their_own_next_steps_half(tmp_path):
    """No target networks: the targets are the next steps' half of the critics' one batch-renormalized forward over
    the replayed and the next steps, detached; the loss is 0.5 x both critics' weighted squared errors."""
    plan = _plan(tmp_path, "--policy_delay", "1")
    algorithm = CrossQ(plan.cfg, plan.spec, torch.device("cpu"), HOOKS)
    assert algorithm.holds.modules == ("model", "critic")
    batch = _batch()
    critic, actor = copy.deepcopy(algorithm.critic), copy.deepcopy(algorithm.model)
    alpha = math.exp(algorithm.log_alpha.item())
    torch.manual_seed(7)
    result = algorithm.train(batch)
    torch.manual_seed(7)
    with torch.no_grad():
        next_actions, next_log_probs = actor.rsample(batch.next_obs["obs"], batch_stats=False)
    x = torch.cat([batch.obs["obs"], batch.next_obs["obs"]])
    actions = torch.cat([(batch.actions / 2.0).clamp(-1, 1), next_actions])
    q1, q2 = critic(x, actions, batch_stats=True)
    next_q = torch.minimum(q1[64:], q2[64:]) - alpha * next_log_probs
    targets = batch.returns + batch.discounts * next_q
    loss = 0.5 * (batch.weights * ((q1[:64] - targets) ** 2 + (q2[:64] - targets) ** 2)).mean()
    assert result.updates == 1 and result.losses["critic_loss"] == pytest.approx(loss.item(), rel=1e-5)
    expected_mean = 0.01 * torch.cat([x, actions], dim=1).mean(0)  # one step of the input renorm's statistics
    torch.testing.assert_close(algorithm.critic.net.input_norm.running_mean[0], expected_mean)
    assert algorithm.optimizer.param_groups[0]["betas"] == (0.5, 0.999)


def test_compile_gives_the_same_updates_past_the_warm_up(tmp_path):
    """--compile (the critics' loss through torch.compile, its random draws torch's) trains as the eager update does,
    before and after batch renormalization's warm-up (r and d chosen by a tensor, not by Python). Adam's epsilon is
    large here: at 1e-8 its first steps move a weight of a near-zero gradient by the learning rate either way, so the
    float sums' other order (1e-7 in the loss) would show as 1e-3 in the weights."""
    import torch._inductor.config

    flags = ("--renorm_warmup_steps", "2", "--adam_eps", "1.0")
    eager = CrossQ(_plan(tmp_path, *flags).cfg, _plan(tmp_path).spec, torch.device("cpu"), HOOKS)
    plan = _plan(tmp_path, *flags, "--compile", "true")
    compiled = CrossQ(plan.cfg, plan.spec, torch.device("cpu"), HOOKS)
    compiled.params.copy_(eager.params)
    compiled.critic_params.copy_(eager.critic_params)
    with torch._inductor.config.patch(fallback_random=True):
        for step in range(4):  # two in the warm-up, two after
            batch = _batch()
            results = []
            for algorithm in (eager, compiled):
                torch.manual_seed(step)
                results.append(algorithm.train(batch))
            assert results[1].losses["critic_loss"] == pytest.approx(results[0].losses["critic_loss"], rel=1e-4)
            torch.testing.assert_close(results[1].priorities, results[0].priorities, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(compiled.critic_params, eager.critic_params, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(compiled.params, eager.params, rtol=1e-4, atol=1e-5)
    assert float(compiled.critic.net.input_norm.steps) == 4  # the compiled forward moved the statistics, once each


def test_it_acts_on_its_running_statistics(tmp_path):
    plan = _plan(tmp_path)
    actor = CrossQ(plan.cfg, plan.spec, torch.device("cpu"), HOOKS).model
    obs = {"obs": torch.randn(256, 3)}
    mean, _ = actor.params(obs["obs"], batch_stats=False)
    greedy = actor.act(obs, None, GREEDY)
    torch.testing.assert_close(greedy.actions, 2.0 * torch.tanh(mean))  # Pendulum's bounds [-2, 2]
    one = actor.act({"obs": obs["obs"][:1]}, None, GREEDY).actions  # a row's action, whatever the batch around it
    torch.testing.assert_close(one, greedy.actions[:1])
    torch.manual_seed(0)
    uniform = actor.act(obs, None, ActContext(training=True, version=0)).actions
    torch.manual_seed(0)
    assert torch.allclose(uniform, torch.rand(256, 1) * 4 - 2)  # before the first update: uniform in the bounds
    assert float(actor.net.input_norm.steps) == 0  # acting never moves the statistics


@pytest.mark.e2e
def test_crossq_learns_pendulum_in_serial_mode(tmp_path, shm_dir):
    """From about -1200 (the untrained greedy policy) to a greedy evaluation better than -700 within 8,000 env steps
    (-230 seen after about 1,000 updates on 2 cores, 50 s; stopped at -300). Evaluations are timed: the threshold
    leaves room. Eager: the compiled update is the eager one (test_compile_gives_the_same_updates_past_the_warm_up),
    and compiling costs from 30 s to minutes on a loaded machine."""
    result = run_train(
        PENDULUM  # its --algo sac, then ours
        + ["--algo", "crossq", "--mode", "serial", "--compile", "false"]
        + ["--train_for_env_steps", "8000", "--learning_starts", "1000"]
        + ["--replay_ratio", "128", "--eval_every_sec", "3", "--eval_episodes", "5", "--stop_at_eval_return", "-300"]
        + ["--experiment", "pendulum", "--shm_dir", shm_dir],
        tmp_path,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_json(tmp_path / "pendulum" / "summary.json")
    assert summary["algo"] == "crossq" and summary["updates_skipped_non_finite"] == 0
    assert summary["eval_return_best"] > -700, summary["eval_return_best"]
    assert os.listdir(shm_dir) == []
