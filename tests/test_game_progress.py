"""Progress in two-player games, where the mean return of a zero-sum game stays 0 in self-play: each seat's
mean return and the win rate against a random player (evaluated by default) on the status line, in
TensorBoard and in summary.json."""

import numpy as np
import pytest
from conftest import SerialRun, serial_plan

from sf_engine.config.cli import make_config
from sf_engine.stats.messages import Episodes, Evaluation, Stages
from sf_engine.stats.report import scalars, status_line, summary
from sf_engine.stats.run_stats import RunStats

RELAY = "toy_multiagent:relay_game"


def _two_player_stats() -> RunStats:
    stats = RunStats(0, np.zeros(1, np.int64))
    stages = Stages("rollout_worker_0", {}, 1.0)
    stats.consume([Episodes(stages, 4, [1.0, -1.0, 1.0, -1.0], [7, 7, 9, 9], seats=[0, 1, 0, 1])])
    stats.consume([Evaluation(5, 0.6, 0.8, 11.0, 10, 0, 0.6, 0.1, win_rate=0.7, draw_rate=0.1, loss_rate=0.2)])
    stats.sample()
    return stats


def test_each_seats_return_and_the_win_rate_against_random_are_shown():
    stats, cfg = _two_player_stats(), make_config({})
    assert stats.return_mean == 0.0 and stats.seat_return_means == [1.0, -1.0]
    line = status_line(stats, cfg, 1)
    assert "| seats +1.00/-1.00 |" in line and "| vs random won 70% drew 10% (v5, 10 games) |" in line, line
    tags = scalars(stats, cfg, 1)
    assert tags["episode/return_seat_0"] == 1.0 and tags["episode/return_seat_1"] == -1.0
    assert tags["eval/win_rate_vs_random"] == 0.7
    figures = summary(stats, cfg, 1)
    assert figures["episode_return_by_seat"] == [1.0, -1.0]
    assert (figures["eval_win_rate_vs_random"], figures["eval_draw_rate_vs_random"]) == (0.7, 0.1)
    assert figures["eval_loss_rate_vs_random"] == 0.2 and figures["eval_version"] == 5


def test_a_one_agent_run_shows_no_seats():
    stats = RunStats(0, np.zeros(1, np.int64))
    stats.consume([Episodes(Stages("rollout_worker_0", {}, 1.0), 2, [20.0, 30.0], [20, 30])])
    assert stats.seat_return_means is None and "seats" not in status_line(stats, make_config({}), 1)


def test_two_player_games_are_evaluated_against_random_by_default(tmp_path, shm_dir):
    pytest.importorskip("pettingzoo")
    from sf_engine.runtime.wiring import roles_of

    plan = serial_plan(tmp_path, shm_dir, RELAY, "--num_envs_per_worker", "8")
    assert plan.cfg.run.eval_every_sec == 30.0 and ("evaluator", 0) in roles_of(plan.cfg)
    plan = serial_plan(tmp_path, shm_dir, RELAY, "--num_envs_per_worker", "8", "--eval_every_sec", "0")
    assert plan.cfg.run.eval_every_sec == 0.0 and ("evaluator", 0) not in roles_of(plan.cfg)  # the flag wins
    assert serial_plan(tmp_path, shm_dir, "CartPole-v1").cfg.run.eval_every_sec == 0.0  # one agent: none


def test_rollout_workers_report_the_seat_of_each_episode(tmp_path, shm_dir):
    pytest.importorskip("pettingzoo")
    plan = serial_plan(tmp_path, shm_dir, RELAY, "--num_envs_per_worker", "8", "--eval_every_sec", "0")
    run = SerialRun(plan, tmp_path)
    try:
        run.full_slots(2)
        run.worker.send_stats()
        episodes = run.messages(Episodes)
        returns = [value for m in episodes for value in m.returns]
        seats = [seat for m in episodes for seat in m.seats]
        assert returns and len(seats) == len(returns)
        assert seats == [0, 1] * (len(seats) // 2)  # the games end whole: each first seat, then second
    finally:
        run.close()
