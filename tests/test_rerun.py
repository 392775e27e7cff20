"""Re-running an experiment: one that already reached its env-step budget says so in one line and exits,
touching nothing; a resumed run that trains little keeps the figures of the run before it in summary.json."""

import json
import os

import numpy as np
import pytest
import torch
from conftest import TINY, files_of, read_json, run_train

from sf_engine.config.cli import make_config, parse_flags
from sf_engine.run.runner import already_done
from sf_engine.runtime.checkpoint import (
    env_steps_of,
    latest_checkpoint,
    load_checkpoint,
    policy_states,
    save_checkpoint,
)
from sf_engine.stats.report import Reporter
from sf_engine.stats.run_stats import RunStats


@pytest.mark.e2e
def test_a_finished_experiment_says_so_in_one_line_and_changes_nothing(tmp_path, shm_dir):
    args = ["--experiment", "done", "--shm_dir", shm_dir, "--train_for_env_steps", "2000"] + TINY
    first = run_train(args, tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    before = files_of(tmp_path / "done")
    again = run_train(args, tmp_path)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    lines = again.stdout.strip().splitlines()
    assert len(lines) == 1, again.stdout
    assert "env-step budget reached (2,000 env steps; --train_for_env_steps raises it)" in lines[0], lines[0]
    assert files_of(tmp_path / "done") == before  # summary.json, config.json, the log: as the first run left them


def _flags(tmp_path, *argv):
    return make_config(parse_flags(["--train_dir", str(tmp_path), "--experiment", "exp"] + list(argv)))


def _checkpoint(tmp_path, version: int, env_steps: int) -> str:
    directory = os.path.join(tmp_path, "exp", "checkpoints")
    return save_checkpoint(directory, {"model": {"w": torch.zeros(1)}}, version, env_steps, keep=10)


def test_only_a_valid_checkpoint_at_the_env_step_budget_makes_a_run_done(tmp_path):
    assert already_done(_flags(tmp_path, "--train_for_env_steps", "3000")) is None  # no checkpoint yet
    _checkpoint(tmp_path, 5, 3000)
    line = already_done(_flags(tmp_path, "--train_for_env_steps", "3000"))
    assert line.startswith("experiment exp has nothing to train: env-step budget reached (3,000 env steps;")
    assert "--train_for_env_steps raises it" in line and "3,000 env steps" in line
    assert already_done(_flags(tmp_path, "--train_for_env_steps", "4000")) is None
    assert already_done(_flags(tmp_path, "--train_for_env_steps", "3000", "--restart")) is None
    assert already_done(_flags(tmp_path, "--train_for_seconds", "60")) is None  # a time budget is per run
    # a newer checkpoint that is corrupt does not count: the valid one before it does
    with open(_checkpoint(tmp_path, 9, 10**6), "r+b") as f:
        f.write(b"garbage")
    assert already_done(_flags(tmp_path, "--train_for_env_steps", "5000")) is None
    assert already_done(_flags(tmp_path, "--train_for_env_steps", "3000")) is not None
    # a bad flag is the plan's to report (one error line), never hidden behind "nothing to train"
    assert already_done(_flags(tmp_path, "--train_for_env_steps", "3000", "--batch_size", "0")) is None


PREVIOUS = {
    "env_steps": 20000,
    "episode_return_mean": 180.5,
    "episodes": 812,
    "policy_lag_mean": 2.5,
    "policy_lag_max": 4.0,
    "learner_version": 40,
    "eval_win_rate_vs_random": 0.9,
}


def _summary_of_a_run_that_trained_nothing(tmp_path, resumed: bool) -> dict:
    (tmp_path / "summary.json").write_text(json.dumps(PREVIOUS))
    stats = RunStats(20000, np.zeros(1, np.int64))
    reporter = Reporter(stats, make_config({}), 1, str(tmp_path), resumed=resumed)
    reporter.close()
    return read_json(tmp_path / "summary.json")


def test_a_resumed_run_that_trained_nothing_keeps_the_earlier_figures(tmp_path):
    summary = _summary_of_a_run_that_trained_nothing(tmp_path, resumed=True)
    for key in ("episode_return_mean", "episodes", "policy_lag_mean", "policy_lag_max", "learner_version"):
        assert summary[key] == PREVIOUS[key], key
    assert summary["eval_win_rate_vs_random"] == 0.9
    assert set(summary["carried_over"]) == {
        "episode_return_mean",
        "episodes",
        "policy_lag_mean",
        "policy_lag_max",
        "learner_version",
        "eval_win_rate_vs_random",
    }
    assert summary["env_steps"] == 20000  # this run's own figures stay its own


def test_a_run_that_starts_over_carries_nothing(tmp_path):
    summary = _summary_of_a_run_that_trained_nothing(tmp_path, resumed=False)
    assert summary["episode_return_mean"] is None and summary["carried_over"] == []


def test_a_run_with_figures_of_its_own_writes_its_own(tmp_path):
    from sf_engine.stats.previous import carry_over

    own = {"episode_return_mean": 12.0, "episodes": 3, "policy_lag_mean": 0.0, "learner_version": 41}
    out = carry_over(own, PREVIOUS)
    assert {k: out[k] for k in own} == own and out["carried_over"] == ["policy_lag_max", "eval_win_rate_vs_random"]


def optimizer_groups(state: dict) -> list:
    """The parameter group of every optimizer in a checkpoint's state of one policy (PPO's one, SAC's three)."""
    optimizers = state.get("optimizers") or {"model": state["optimizer"]}
    return [optimizer["param_groups"][0] for optimizer in optimizers.values()]


@pytest.mark.e2e
@pytest.mark.parametrize(
    "algo_flags",
    [
        [],  # ppo on CartPole-v1
        ["--algo", "sac", "--env", "Pendulum-v1", "--learning_starts", "256", "--replay_ratio", "8"],
    ],
    ids=["ppo", "sac"],
)
def test_a_resumed_run_takes_this_runs_adam_epsilon_and_learning_rate(tmp_path, shm_dir, algo_flags):
    """A short serial run, then the same experiment resumed with another --adam_eps and --learning_rate: the
    changed flags win over the checkpoint's optimizer settings (every optimizer's; the moments carry on), and the
    log names them."""
    args = ["--experiment", "eps", "--shm_dir", shm_dir, "--hidden_size", "32"] + TINY + algo_flags
    first = run_train(args + ["--train_for_env_steps", "1500"], tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    resumed = ["--train_for_env_steps", "3000", "--adam_eps", "0.001", "--learning_rate", "0.0002"]
    second = run_train(args + resumed, tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    log = (tmp_path / "eps" / "train.log").read_text()
    assert "--adam_eps 1e-" in log and "-> 0.001" in log and "--learning_rate" in log, log
    path = latest_checkpoint(str(tmp_path / "eps" / "checkpoints"))
    assert env_steps_of(path) >= 3000
    (state,) = policy_states(load_checkpoint(path))
    groups = optimizer_groups(state)
    assert len(groups) == (3 if algo_flags else 1)
    assert all(group["eps"] == 0.001 for group in groups), [group["eps"] for group in groups]
    assert groups[0]["lr"] == 0.0002, groups[0]["lr"]
