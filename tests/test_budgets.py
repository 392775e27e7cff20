"""The run's budgets: each applies when given (the defaults only when neither is), a stop on one names it and
the flag that raises it, and what reads them (learning-rate decay, time left) copes with one not set."""

import dataclasses
import time

import numpy as np
import pytest

from sf_engine.config.cli import make_config, parse_flags
from sf_engine.config.groups import DEFAULT_ENV_STEPS, DEFAULT_SECONDS
from sf_engine.run.runner import MONITOR_EVERY_SEC, MONITOR_NEAR_BUDGET_SEC, _budget_reached, _until_next_look
from sf_engine.stats.messages import Episodes, Stages
from sf_engine.stats.report import status_line
from sf_engine.stats.run_stats import RunStats


def budgets(*argv):
    run = make_config(parse_flags(list(argv))).run
    return run.train_for_env_steps, run.train_for_seconds


def test_a_time_budget_alone_is_the_only_budget():
    assert budgets("--train_for_seconds", "120") == (None, 120.0)


def test_an_env_step_budget_alone_is_the_only_budget():
    assert budgets("--train_for_env_steps", "5000") == (5000, None)


def test_both_budgets_apply_when_given_and_the_defaults_when_neither_is():
    assert budgets("--train_for_env_steps", "5000", "--train_for_seconds", "9") == (5000, 9.0)
    assert budgets() == (DEFAULT_ENV_STEPS, DEFAULT_SECONDS)


@pytest.mark.parametrize("flag", ["--train_for_env_steps", "--train_for_seconds"])
def test_a_budget_that_is_not_positive_is_one_line_naming_it(flag, tmp_path, capsys):
    from conftest import main_error

    from sf_engine.run.runner import main

    line = main_error(main, ["--train_dir", str(tmp_path), flag, "0"], capsys)
    assert flag in line and "positive" in line, line


def test_saved_config_of_a_time_budget_run_keeps_it_the_only_budget(tmp_path):
    """config.json records a budget not set as null, and --config of it reads back the same budgets."""
    import json

    from sf_engine.config.file import read_config_file

    cfg = make_config(parse_flags(["--train_for_seconds", "120"]))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg.to_dict()))
    assert json.loads(path.read_text())["run"]["train_for_env_steps"] is None
    assert make_config({}, saved=read_config_file(str(path))).run.train_for_env_steps is None


def _stats(env_steps: int) -> RunStats:
    return RunStats(0, np.array([env_steps]))


def test_each_stop_names_its_budget_and_the_flag_that_raises_it():
    env_steps_cfg = make_config(parse_flags(["--train_for_env_steps", "1000"]))
    reason = _budget_reached(env_steps_cfg, _stats(1000), time.monotonic())
    assert reason == "env-step budget reached (1,000 env steps; --train_for_env_steps raises it)"
    time_cfg = make_config(parse_flags(["--train_for_seconds", "120"]))
    assert _budget_reached(time_cfg, _stats(10**12), time.monotonic()) is None  # no env-step budget: steps go on
    reason = _budget_reached(time_cfg, _stats(0), time.monotonic() - 121)
    assert reason == "time budget reached (120 s; --train_for_seconds raises it)"


def test_the_runner_looks_sooner_where_the_env_step_budget_is_near():
    """A quarter second between looks, but where the budget comes sooner at the last look's rate, about then (at
    least a hundredth of a second): a fast run passes its budget by a few hundredths of a second's sampling."""
    one_second_ago = time.monotonic() - 1.0
    assert _until_next_look(None, 500_000, (one_second_ago, 0)) == MONITOR_EVERY_SEC  # no env-step budget
    assert _until_next_look(10**9, 500_000, (one_second_ago, 0)) == MONITOR_EVERY_SEC  # far off
    assert _until_next_look(600_000, 500_000, (one_second_ago, 500_000)) == MONITOR_EVERY_SEC  # no steps: no rate
    assert abs(_until_next_look(550_000, 500_000, (one_second_ago, 0)) - 0.1) < 0.01  # 50,000 at 500,000/s
    assert _until_next_look(500_100, 500_000, (one_second_ago, 0)) == MONITOR_NEAR_BUDGET_SEC


def test_learning_rate_decays_over_the_budgets_that_apply():
    """--lr_schedule linear: by the larger part used of the budgets that apply (the time budget alone:
    over this run's seconds), reaching 0 at the first budget reached."""
    run = make_config(parse_flags(["--train_for_seconds", "100"])).run
    assert run.budget_used(10**9, 25.0) == pytest.approx(0.25)
    run = make_config(parse_flags(["--train_for_env_steps", "1000"])).run
    assert run.budget_used(250, 10**6) == pytest.approx(0.25)
    run = make_config(parse_flags(["--train_for_env_steps", "1000", "--train_for_seconds", "100"])).run
    assert run.budget_used(250, 50.0) == pytest.approx(0.5) and run.budget_used(2000, 1.0) == 1.0


def test_ppo_linear_schedule_under_a_time_budget_alone():
    import torch

    from sf_engine.algo.base import TrainingHooks, schedule_learning_rate
    from sf_engine.algo.ppo.learning import PPO
    from sf_engine.envs import probe_env_spec
    from sf_engine.model.shape import resolve_model_config

    cfg = make_config(parse_flags(["--train_for_seconds", "100", "--lr_schedule", "linear"]))
    spec = probe_env_spec("CartPole-v1", "auto")
    cfg = dataclasses.replace(cfg, model=resolve_model_config(cfg.model, spec))
    hooks = TrainingHooks(env_steps=lambda: 10**9, beat=lambda: None, stopping=lambda: False, elapsed_sec=lambda: 50.0)
    ppo = PPO(cfg, spec, torch.device("cpu"), hooks)  # half of this run's time is spent
    schedule_learning_rate(ppo.optimizer, ppo.cfg, ppo.lcfg, hooks)  # as PPO's training does
    assert ppo.learning_rate == pytest.approx(cfg.learner.learning_rate / 2, rel=0.01)


def test_learning_rate_decays_to_lr_end_over_lr_decay_env_steps_and_stays():
    """--lr_decay_env_steps: the linear schedule runs from --learning_rate to --lr_end over those env steps,
    whatever the budgets, then keeps --lr_end; a DQN learner sets it as it trains."""
    import torch

    from sf_engine.algo.base import TrainingHooks
    from sf_engine.algo.dqn.learning import DQN
    from sf_engine.envs import probe_env_spec
    from sf_engine.model.shape import resolve_model_config

    flags = ["--algo", "dqn", "--learning_rate", "2e-3", "--lr_schedule", "linear", "--lr_end", "1e-4"]
    cfg = make_config(parse_flags([*flags, "--lr_decay_env_steps", "1000", "--train_for_env_steps", "10000"]))
    spec = probe_env_spec("CartPole-v1", "auto")
    cfg = dataclasses.replace(cfg, model=resolve_model_config(cfg.model, spec))
    steps = [0]
    hooks = TrainingHooks(env_steps=lambda: steps[0], beat=lambda: None, stopping=lambda: False, elapsed_sec=lambda: 0)
    dqn = DQN(cfg, spec, torch.device("cpu"), hooks)
    for env_steps, expected in ((0, 2e-3), (250, 2e-3 - 0.25 * 1.9e-3), (1000, 1e-4), (9000, 1e-4)):
        steps[0] = env_steps
        dqn.scheduled_learning_rate()  # as its train() does every 64 updates
        assert dqn.learning_rate == pytest.approx(expected)


def test_time_left_with_one_budget_not_set():
    cfg = make_config(parse_flags(["--train_for_seconds", "120"]))
    stats = _stats(5000)
    stats.sample()
    assert status_line(stats, cfg, 1).endswith("| ETA 120s")
    cfg = make_config(parse_flags(["--train_for_env_steps", "5000"]))
    assert status_line(stats, cfg, 1).endswith("| ETA -")  # no rate yet, no time budget


def test_time_left_of_the_env_step_budget_of_node_groups_counts_them_all():
    """With node groups the env-step budget counts the env steps of all of them: each taken to step as this one."""
    from sf_engine.stats.report import _seconds_left

    stats = _stats(5000)
    one = make_config(parse_flags(["--train_for_env_steps", "20000"]))
    two = make_config(parse_flags(["--train_for_env_steps", "20000", "--dist_init", "tcp://a:1", "--dist_world", "2"]))
    assert _seconds_left(stats, one, 0.0, 1000.0) == "15s" and _seconds_left(stats, two, 0.0, 1000.0) == "5s"


def _episode_report(returns: list) -> Episodes:
    return Episodes(Stages("rollout_worker_0", {}, 1.0), len(returns), returns, [10] * len(returns))


@pytest.mark.parametrize("episodes_final", [False, True])
def test_the_workers_last_episodes_count_after_a_budget_stop_not_after_a_stop_on_the_figures(episodes_final):
    """A budget stop: the episodes the workers report as they stop count, as their steps do; a stop decided on the
    figures (a return target, an observer) keeps the figures it was decided on."""
    stats = _stats(1000)
    stats.consume([_episode_report([10.0, 20.0])])
    stats.stop(episodes_final=episodes_final)
    stats.consume([_episode_report([60.0])])
    assert (stats.episodes, stats.return_mean) == ((2, 15.0) if episodes_final else (3, 30.0))


@pytest.mark.e2e
def test_a_run_shorter_than_a_workers_report_interval_has_its_episodes_in_its_summary(tmp_path, shm_dir):
    """CartPole episodes end every few dozen steps: a 20,000-step run (a fraction of a second) has some."""
    import sf_engine

    result = sf_engine.train(
        env="CartPole-v1",
        experiment="short",
        train_dir=str(tmp_path),
        shm_dir=shm_dir,
        train_for_env_steps=20_000,
        num_workers=1,
    )
    assert result.summary["episodes"] > 0 and result.summary["episode_return_mean"] is not None, result.summary
