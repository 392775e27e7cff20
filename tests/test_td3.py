"""TD3 (--algo td3), added as one folder (sf_engine/algo/td3/): its update in pieces (delayed actor and target
updates, target policy smoothing, Gaussian exploration), then whole runs: it learns Pendulum, resumes in async mode
with its critics and targets, and enjoy.py, load_policy and export act on its deterministic action."""

import os

import numpy as np
import pytest
import torch
from conftest import read_json, run_train, train_error

import sf_engine
from sf_engine.algo.base import TrainingHooks
from sf_engine.algo.batch import ReplayBatch
from sf_engine.algo.td3.learning import TD3

PENDULUM = ["--algo", "td3", "--env", "Pendulum-v1", "--num_workers", "1", "--hidden_size", "64", "--seed", "1"]


def _td3(tmp_path, *flags):
    from sf_engine.run.plan import build_plan

    plan = build_plan(PENDULUM + ["--train_dir", str(tmp_path), "--mode", "serial"] + list(flags))
    hooks = TrainingHooks(lambda: 0, lambda: None, lambda: False, lambda: 0.0)
    return TD3(plan.cfg, plan.spec, torch.device("cpu"), hooks), plan


def _batch(size: int = 32, seed: int = 0) -> ReplayBatch:
    rng = torch.Generator().manual_seed(seed)
    obs = {"obs": torch.randn(size, 3, generator=rng)}
    return ReplayBatch(
        obs=obs,
        actions=torch.rand(size, 1, generator=rng) * 4 - 2,
        returns=torch.randn(size, generator=rng),
        discounts=torch.full((size,), 0.99),
        next_obs={"obs": torch.randn(size, 3, generator=rng)},
        weights=torch.ones(size),
    )


def test_the_actor_and_the_targets_move_every_policy_delay_updates_and_the_critics_every_one(tmp_path):
    td3, _ = _td3(tmp_path, "--policy_delay", "2")
    moved = []
    for step in range(4):
        before = [t.clone() for t in (td3.params, td3.critic_params, td3.target_params, td3.actor_target_params)]
        result = td3.train(_batch(seed=step))
        td_abs = result.priorities
        after = (td3.params, td3.critic_params, td3.target_params, td3.actor_target_params)
        moved.append(tuple(not torch.equal(b, a) for b, a in zip(before, after)))
        assert result.updates == 1 and td_abs.shape == (32,) and set(result.losses) >= {"critic_loss", "actor_loss"}
    # (actor, critics, target critics, target actor) at updates 0..3: the critics always, the rest at 0 and 2
    assert moved == [(True, True, True, True), (False, True, False, False)] * 2


def test_compile_takes_the_eager_updates_through_compiled_losses(tmp_path):
    """--compile: the critics' and the actor's losses through torch.compile (its random draws torch's, as eager
    ones are) take the same three updates from the same weights, the actor's at the first and the third."""
    import torch._dynamo as dynamo
    from test_sac import _eager_random_draws

    dynamo.reset()
    dynamo.utils.counters.clear()
    runs = []
    for compile_flag in ("false", "true"):
        torch.manual_seed(0)
        td3, _ = _td3(tmp_path, "--policy_delay", "2", "--compile", compile_flag)
        results = []
        with _eager_random_draws():
            for step in range(3):
                torch.manual_seed(step)
                results.append(td3.train(_batch(seed=step)))
        runs.append((td3, results))
    assert dynamo.utils.counters["stats"]["unique_graphs"] == 2  # the critics' loss and the actor's
    (eager, eager_results), (compiled, compiled_results) = runs
    for name in ("params", "critic_params", "target_params", "actor_target_params"):
        torch.testing.assert_close(getattr(compiled, name), getattr(eager, name), rtol=1e-4, atol=1e-6, msg=name)
    for mine, theirs in zip(compiled_results, eager_results):
        torch.testing.assert_close(mine.priorities, theirs.priorities, rtol=1e-4, atol=1e-5)
        assert mine.losses == pytest.approx(theirs.losses, rel=1e-4, abs=1e-5)


def test_target_policy_smoothing_keeps_the_noise_within_its_clip_and_acting_explores_within_the_bounds(tmp_path):
    td3, _ = _td3(tmp_path, "--target_noise", "5.0", "--target_noise_clip", "0.1")
    next_x = torch.randn(4096, 3)
    with torch.no_grad():
        smoothed = td3.actor_target.squashed(next_x)
    seen = []
    td3.target = lambda x, actions: (seen.append(actions) or actions[:, 0],) * 2  # the target critics see the actions
    batch = _batch(4096)
    td3._targets(next_x, batch.returns, batch.discounts)
    assert (seen[0] - smoothed).abs().max() <= 0.1 + 1e-6 and (seen[0] - smoothed).abs().max() > 0.09
    actions = td3.model.sample({"obs": torch.randn(4096, 3)})[0]
    greedy = td3.model.greedy({"obs": torch.zeros(1, 3)})[0]
    assert actions.abs().max() <= 2.0 and actions.std() > 0 and greedy.abs().max() <= 2.0


def test_a_td3_state_round_trips_through_a_checkpoint(tmp_path):
    td3, _ = _td3(tmp_path)
    for step in range(3):
        td3.train(_batch(seed=step))
    other, _ = _td3(tmp_path, "--seed", "7")
    other.load(td3.state(), "test")
    for mine, theirs in (
        (td3.params, other.params),
        (td3.critic_params, other.critic_params),
        (td3.target_params, other.target_params),
        (td3.actor_target_params, other.actor_target_params),
    ):
        assert torch.equal(mine, theirs)
    assert other.num_updates == 3


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--env", "CartPole-v1"], ["--algo td3", "Box", "--algo ppo"]),
        (["--rnn", "gru"], ["--rnn gru", "--algo td3"]),
        (["--num_policies", "2"], ["--num_policies", "--algo td3", "--algo ppo"]),
        (["--policy_delay", "x"], ["--policy_delay"]),
        (["--policy_delay", "0"], ["--policy_delay", "at least 1"]),
        (["--target_noise", "-0.1"], ["--target_noise", ">= 0"]),
        (["--exploration_noise", "nan"], ["--exploration_noise", "finite"]),
    ],
)
def test_what_td3_does_not_take_is_one_line(tmp_path, capsys, flags, words):
    line = train_error(PENDULUM + flags, tmp_path, capsys)
    assert all(word in line for word in words), line


@pytest.mark.e2e
def test_td3_learns_pendulum_in_serial_mode(tmp_path, shm_dir):
    """From about -1200 (the untrained greedy policy) to a greedy evaluation better than -400 within 15,000 env
    steps, stopped at -300. Evaluations are timed: the threshold leaves room."""
    result = run_train(
        PENDULUM
        + ["--mode", "serial", "--train_for_env_steps", "15000", "--learning_starts", "1000", "--replay_ratio", "256"]
        + ["--eval_every_sec", "3", "--eval_episodes", "5", "--stop_at_eval_return", "-300"]
        + ["--experiment", "pendulum", "--shm_dir", shm_dir],
        tmp_path,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_json(tmp_path / "pendulum" / "summary.json")
    assert summary["algo"] == "td3" and summary["updates_skipped_non_finite"] == 0
    assert summary["eval_return_best"] > -400, summary["eval_return_best"]
    assert os.listdir(shm_dir) == []


@pytest.mark.e2e
@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_an_async_td3_run_resumes_and_its_deterministic_action_is_what_every_acting_site_takes(tmp_path, shm_dir):
    """Async mode: a short run, resumed from its checkpoint (the critics, targets and optimizers back); then
    load_policy, enjoy.py's greedy episodes and the exported files all take the actor's scaled tanh."""
    import onnxruntime

    from sf_engine.play.export import main as export_main

    flags = PENDULUM + ["--learning_starts", "500", "--replay_ratio", "16", "--batch_size", "64"]
    flags += ["--experiment", "async", "--shm_dir", shm_dir]
    first = run_train(flags + ["--train_for_env_steps", "3000"], tmp_path, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    summary = read_json(tmp_path / "async" / "summary.json")
    assert summary["algo"] == "td3" and summary["learner_version"] > 0 and abs(summary["replay_ratio"] - 16) < 2
    # 2,000 env steps more: the budget is checked every quarter second, so the first run may pass 3,000 by thousands
    longer = summary["env_steps"] + 2000
    second = run_train(flags + ["--train_for_env_steps", str(longer)], tmp_path, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    resumed = read_json(tmp_path / "async" / "summary.json")
    assert resumed["learner_version"] > summary["learner_version"] and os.listdir(shm_dir) == []

    policy = sf_engine.load_policy(str(tmp_path / "async"))
    obs = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    actions = policy.act(obs)
    with torch.no_grad():
        expected = 2.0 * torch.tanh(policy.model({"obs": torch.from_numpy(obs)})[0]).numpy()
    np.testing.assert_allclose(actions, expected, rtol=1e-6, atol=1e-6)
    assert export_main(["--train_dir", str(tmp_path), "--experiment", "async"]) == 0
    onnx_action, _ = onnxruntime.InferenceSession(str(tmp_path / "async" / "export" / "policy.onnx")).run(
        None, {"obs": obs}
    )
    np.testing.assert_allclose(onnx_action, expected, rtol=1e-5, atol=1e-5)
