"""Multi-agent envs (PettingZoo): agents as rows, rewards credited to the agent they belong to, absent
and waiting rows never training the policy, two-player games against an opponent, and one-line errors
for what the engine cannot batch."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")

from conftest import REPO, read_json, run_train, train_error  # noqa: E402

from sf_engine.algo.ppo import loss as ppo_loss  # noqa: E402
from sf_engine.envs import make_batch_env, probe_env_spec  # noqa: E402
from sf_engine.run.plan import build_plan  # noqa: E402
from sf_engine.run.runner import run  # noqa: E402

RELAY, VANISHING, CUE = "toy_multiagent:relay_game", "toy_multiagent:vanishing", "toy_multiagent:cue_game"


def test_turn_based_rewards_reach_the_agent_they_belong_to():
    """RelayGame pays an agent's move with the opponent's next one: each row's reward at each step is
    what the game gave that agent then (the log), whoever moved; only the mover's row is acting; the
    game's end is both rows' end, and the step after it resets them."""
    spec = probe_env_spec(RELAY, "auto")
    assert spec.agents == ("first", "second") and spec.turn_based
    env = make_batch_env(RELAY, "auto", 4, seed=0, spec=spec)
    env.reset()
    assert env.acting.tolist() == [True, False, True, False] and env.alive.all()
    moves = [np.array([1, 0, 0, 0]), np.array([0, 0, 0, 1]), np.array([0, 0, 1, 0]), np.array([0, 0, 0, 0])]
    totals = np.zeros(4)
    for move, actions in enumerate(moves, start=1):
        result = env.step(actions)
        for game in range(2):
            logged_move, mover, rewards = env.games[game].log[-1]
            assert logged_move == move and mover == ("first" if move % 2 else "second")
            assert result.rewards[2 * game : 2 * game + 2].tolist() == [rewards["first"], rewards["second"]]
        totals += result.rewards
        over = move == 4
        assert result.terminated.tolist() == [over] * 4 and result.episode_over.tolist() == [over] * 4
        if not over:
            assert result.acting.tolist() == ([False, True] * 2 if move % 2 else [True, False] * 2)
        if move == 3:  # the second seat's correct move 2 of game 0 is paid while it waits
            assert result.rewards.tolist() == [0.0, 1.0, 0.0, 0.0]
    # game 0: first 1 (right) then 0 (wrong), second 0, 0 (both right); game 1: first 0, 1; second 1, 0
    assert totals.tolist() == [1.0, 2.0, 1.0, 1.0]
    result = env.step(np.zeros(4, np.int64))  # the reset step
    assert not result.episode_over.any() and not result.rewards.any() and result.alive.all()
    assert result.acting.tolist() == [True, False, True, False]
    env.close()


def test_agents_that_leave_a_parallel_game_are_absent_rows():
    """VanishingParallel: 'short' leaves after 2 steps; its row is then not alive (its obs zeros, no
    reward, never done again) until the game ends and resets."""
    spec = probe_env_spec(VANISHING, "auto")
    assert spec.agents == ("a", "short", "c") and not spec.turn_based
    env = make_batch_env(VANISHING, "auto", 3, seed=0, spec=spec)
    env.reset()
    ones = np.ones(3, np.int64)
    first, second = env.step(ones), env.step(ones)
    assert first.rewards.tolist() == [2.0, 2.0, 2.0] and not first.terminated.any()
    assert second.terminated.tolist() == [False, True, False] and second.alive.tolist() == [True, False, True]
    assert second.obs["obs"][1].tolist() == [0.5, 0.5]  # its last observation, for a truncation's bootstrap
    third = env.step(ones)
    assert third.rewards.tolist() == [2.0, 0.0, 2.0] and third.alive.tolist() == [True, False, True]
    assert not third.terminated[1] and third.obs["obs"][1].tolist() == [0.0, 0.0]
    fourth = env.step(ones)
    assert fourth.terminated.tolist() == [True, False, True] and not fourth.alive.any()
    reset = env.step(ones)
    assert reset.alive.all() and not reset.rewards.any()
    env.close()


def test_a_dict_observation_and_a_tuple_action_of_a_parallel_game():
    """CueParallel's agents observe a Dict of a Discrete cue, a Discrete(2, start=1) seat and a nested Box: each
    row holds the flat entries (one-hot, or the table rows with --discrete_obs embed); its Tuple action of a
    Discrete and a MultiBinary reaches each agent as the env's own tuple, paid as the env says."""
    spec = probe_env_spec(CUE, "auto")
    assert [key for key, _, _ in spec.obs] == ["clock/left", "cue", "seat"] and spec.action.kind == "composite"
    env = make_batch_env(CUE, "auto", 4, seed=0, spec=spec)
    obs = env.reset()
    cues = [[env.games[g].cues[a] for a in ("left", "right")] for g in range(2)]
    assert obs["cue"].argmax(1).tolist() == sum(cues, []) and obs["cue"].sum(1).tolist() == [1.0] * 4
    assert obs["seat"].tolist() == [[1.0, 0.0], [0.0, 1.0]] * 2 and obs["clock/left"][:, 0].tolist() == [1.0] * 4
    actions = np.array([[cues[0][0], 1, 0], [0, 1, 0], [cues[1][0], 0, 1], [cues[1][1], 0, 1]])
    result = env.step(actions)
    expected = [2.0, float(cues[0][1] == 0), 1.0, 2.0]
    assert result.rewards.tolist() == expected and result.obs["clock/left"][:, 0].tolist() == [0.875] * 4
    env.close()
    embedded = probe_env_spec(CUE, "auto", discrete="embed")
    env = make_batch_env(CUE, "auto", 2, seed=0, spec=embedded)
    obs = env.reset()  # each Discrete part as its row of one table: the seat's rows are 0 and 1
    assert obs["seat"][:, 0].tolist() == [0.0, 1.0]
    assert obs["cue"][:, 0].tolist() == [env.games[0].cues[a] for a in ("left", "right")]
    env.close()


@pytest.mark.e2e
def test_ppo_learns_a_parallel_game_of_dict_observations_and_tuple_actions(tmp_path, shm_dir):
    """Both seats of CueParallel learn to name their cue and set their seat's bits (16 of 16 at best, about 6.7 at
    random), which they can only do by reading the one-hot cue and seat; load_policy then plays it greedily from the
    env's own Dict observations."""
    import toy_multiagent

    import sf_engine

    result = sf_engine.train(
        env=CUE,
        mode="serial",
        train_dir=str(tmp_path),
        experiment="cue",
        shm_dir=shm_dir,
        num_envs_per_worker=32,
        stop_at_return=15.0,
        train_for_env_steps=1_000_000,
    )
    assert result.summary["episode_return_mean"] >= 15.0, result.summary
    policy, game = sf_engine.load_policy(result.experiment_dir), toy_multiagent.CueParallel()
    totals = dict.fromkeys(game.possible_agents, 0.0)
    for seed in range(5):
        obs, _ = game.reset(seed=seed)
        while game.agents:
            agents = list(obs)
            batch = {key: np.array([obs[a][key] for a in agents]) for key in ("cue", "seat")}
            batch["clock"] = {"left": np.array([obs[a]["clock"]["left"] for a in agents])}
            actions = policy.act(batch)
            moves = {a: (int(actions[0][i]), actions[1][i]) for i, a in enumerate(agents)}
            obs, rewards, _, _, _ = game.step(moves)
            totals = {a: totals[a] + rewards[a] for a in totals}
    assert min(totals.values()) / 5 >= 15.0, totals


def test_agents_whose_spaces_differ_are_one_line(tmp_path, shm_dir, capsys):
    line = train_error(["--env", "toy_multiagent:mixed_spaces", "--shm_dir", shm_dir], tmp_path, capsys)
    assert "'a' and 'c' have different observation spaces" in line and "pad" in line, line
    assert os.listdir(tmp_path) == []


def test_a_worker_takes_whole_games(tmp_path, shm_dir, capsys):
    line = train_error(["--env", VANISHING, "--shm_dir", shm_dir, "--num_envs_per_worker", "8"], tmp_path, capsys)
    assert "--num_envs_per_worker 8" in line and "3 agents per game" in line and "multiple of 6" in line, line


def test_waiting_rows_train_the_value_but_never_the_policy():
    """The learner's loss with a turn-based batch: the rows whose agent was not to move get no gradient
    on their logits (neither the policy term nor the entropy's), while their values are trained; the
    policy terms equal those of the acting rows alone."""
    torch.manual_seed(0)
    logits = torch.randn(64, 5, requires_grad=True)
    values = torch.randn(64, requires_grad=True)
    actions, old = torch.randint(0, 5, (64,)), torch.randn(64) - 1.6
    advantages, returns = torch.randn(64), torch.randn(64)
    acting = (torch.arange(64) % 2 == 0).float()
    log_pi = logits.log_softmax(-1)
    log_probs, entropy = log_pi.gather(1, actions[:, None]).squeeze(1), -(log_pi.exp() * log_pi).sum(-1)
    losses = ppo_loss.ppo_losses(
        log_probs, old, ppo_loss.normalize(advantages, acting), values, returns, entropy, 0.2, weight=acting
    )
    (losses[0] - 0.01 * losses[2] + losses[1]).backward()
    assert not logits.grad[1::2].any() and logits.grad[0::2].abs().sum() > 0
    assert values.grad[1::2].abs().sum() > 0

    keep = acting.bool()
    alone = ppo_loss.ppo_losses(
        log_probs[keep],
        old[keep],
        ppo_loss.normalize(advantages[keep]),
        values[keep],
        returns[keep],
        entropy[keep],
        0.2,
    )
    for name, ours, reference in zip(
        ("policy", "entropy", "kl", "clip"), [losses[i] for i in (0, 2, 3, 4)], [alone[i] for i in (0, 2, 3, 4)]
    ):
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "flags", [[], ["--rnn", "gru", "--rnn_size", "16", "--with_vtrace", "true"]], ids=["feed_forward", "gru_vtrace"]
)
def test_self_play_learns_rewards_that_arrive_while_waiting(tmp_path, shm_dir, flags):
    """One policy plays both seats of RelayGame, whose pay always arrives on the opponent's turn:
    it learns each seat's correct move (return 2 of 2; random play earns 1), which it can only do when
    those rewards are credited to the right agent's move. Then enjoy.py --opponent plays it against a
    random player from both seats and ends with the JSON line of its rates."""
    plan = build_plan(
        [
            "--env",
            RELAY,
            "--train_dir",
            str(tmp_path),
            "--experiment",
            "relay",
            "--mode",
            "serial",
            "--shm_dir",
            shm_dir,
            "--num_workers",
            "1",
            "--num_envs_per_worker",
            "32",
            "--rollout",
            "16",
            "--batch_size",
            "256",
            "--train_for_env_steps",
            "40000",
            "--learning_rate",
            "3e-3",
        ]
        + flags
    )
    assert run(plan) == 0
    summary = read_json(tmp_path / "relay" / "summary.json")
    assert summary["episode_return_mean"] > 1.85, summary
    assert os.listdir(shm_dir) == []
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "enjoy.py"),
            "--train_dir",
            str(tmp_path),
            "--experiment",
            "relay",
            "--opponent",
            "random",
            "--num_episodes",
            "40",
            "--deterministic",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "tests")),
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["games"] == 40 and figures["games_per_seat"] == [20, 20]
    assert figures["wins"] + figures["draws"] + figures["losses"] == 40
    assert figures["return_mean"] == 2.0 and figures["loss_rate"] == 0.0, figures


@pytest.mark.e2e
def test_connect_four_in_processes_beats_a_random_player(tmp_path, shm_dir):
    """PettingZoo's Connect Four (action masks, turns) through the whole engine in processes for 300,000 env steps
    (a budget in steps, not seconds: a slower machine trains as much): the processes exit, the shared memory is
    released, and the policy beats a random player from both seats in most of 200 games (an untrained one wins about
    half; at 250,000 env steps it won 70.5% to 80%)."""
    result = run_train(
        [
            "--env",
            "pettingzoo.classic.connect_four_v3:env",
            "--experiment",
            "c4",
            "--shm_dir",
            shm_dir,
            "--train_for_env_steps",
            "300000",
        ],
        tmp_path,
        timeout=480,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert os.listdir(shm_dir) == []
    games = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "enjoy.py"),
            "--train_dir",
            str(tmp_path),
            "--experiment",
            "c4",
            "--opponent",
            "random",
            "--num_episodes",
            "200",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert games.returncode == 0, games.stderr
    figures = json.loads(games.stdout.strip().splitlines()[-1])
    assert figures["games_per_seat"] == [100, 100] and figures["win_rate"] > 0.65, figures


def test_the_connect_four_heuristic_wins_when_it_can_and_blocks_when_it_must():
    from sf_engine.envs.opponents import connect_four_heuristic

    planes = np.zeros((6, 7, 2), np.int8)
    planes[5, 0:3, 0] = 1  # three of ours in the bottom row: column 3 wins
    planes[5, 4:6, 1] = planes[4, 4, 1] = 1
    mask = np.ones(7, np.int8)
    assert connect_four_heuristic({"observation": planes, "action_mask": mask}) == 3
    planes = np.zeros((6, 7, 2), np.int8)
    planes[3:6, 6, 1] = 1  # three of theirs stacked in column 6: block it
    planes[5, 0, 0] = planes[5, 2, 0] = 1
    assert connect_four_heuristic({"observation": planes, "action_mask": mask}) == 6


def test_an_opponent_that_cannot_play_is_one_line(tmp_path, capsys):
    from conftest import main_error

    from sf_engine.play.enjoy import main

    plan = build_plan(
        [
            "--env",
            RELAY,
            "--train_dir",
            str(tmp_path),
            "--experiment",
            "relay",
            "--mode",
            "serial",
            "--num_workers",
            "1",
            "--num_envs_per_worker",
            "8",
            "--rollout",
            "8",
            "--batch_size",
            "64",
            "--train_for_env_steps",
            "64",
        ]
    )
    assert run(plan) == 0
    base = ["--train_dir", str(tmp_path), "--experiment", "relay"]
    line = main_error(main, base + ["--opponent", "no_such_module:play"], capsys)
    assert "--opponent no_such_module:play" in line and "cannot import" in line, line
    line = main_error(main, base + ["--opponent", str(tmp_path / "missing.pt")], capsys)
    assert "no such file" in line, line


def test_an_agent_that_leaves_while_waiting_is_done_once_then_absent():
    """DropoutGame knocks 'c' out on a's first move: its row is done at that step, once, then absent
    (never acting, no reward, not done again) while a and b play on, until the game ends and resets."""
    env_id = "toy_multiagent:dropout_game"
    spec = probe_env_spec(env_id, "auto")
    env = make_batch_env(env_id, "auto", 3, seed=0, spec=spec)
    env.reset()
    steps = [env.step(np.zeros(3, np.int64)) for _ in range(7)]
    assert [bool(s.terminated[2]) for s in steps] == [True] + [False] * 6
    assert steps[0].rewards.tolist() == [1.0, 0.0, -1.0]
    for s in steps[1:5]:
        assert not s.alive[2] and not s.acting[2] and s.rewards[2] == 0.0
        assert s.alive[:2].all() and s.acting[:2].sum() == 1
    assert steps[5].terminated[:2].all() and steps[5].episode_over[:2].all()
    assert steps[6].alive.all() and steps[6].acting.tolist() == [True, False, False]  # reset
    env.close()


def test_replay_counts_an_agent_that_left_early_only_while_it_played():
    """episodes.play on DropoutGame (enjoy.py without --opponent): 'c' is counted for the one step it is
    in each game, a and b for all six (three moves each), game after game."""
    from sf_engine.config.groups import ModelConfig
    from sf_engine.model.actor_critic import ActorCritic
    from sf_engine.model.shape import resolve_model_config
    from sf_engine.play.episodes import play

    spec = probe_env_spec("toy_multiagent:dropout_game", "auto")
    env = make_batch_env("toy_multiagent:dropout_game", "auto", 3, seed=0, spec=spec, training=False)
    model = ActorCritic(spec, resolve_model_config(ModelConfig(rnn="gru", rnn_size=8), spec))
    episodes = list(play(model, env, 2))
    env.close()
    by_row = {row: [(ret, length) for r, ret, length in episodes if r == row] for row in range(3)}
    assert by_row[2] == [(-1.0, 1), (-1.0, 1)]
    assert by_row[0] == by_row[1] == [(3.0, 6), (3.0, 6)], by_row  # a and b move 3 times each
