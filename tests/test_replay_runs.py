"""Whole runs of the value-based algorithms: DQN learns CartPole in serial mode on a small budget, PQN too; the rate
limiter holds the replay ratio; sync mode trains with lag 0 at insertion; a resumed run refills its replay buffer
from scratch, or from the saved one with --save_replay; every new flag's bad value is one line before anything on
disk changes; what --algo dqn does not do yet is one line."""

import os

import numpy as np
import pytest
from conftest import assert_refused_untouched, read_json, run_train, train_error

DQN_SMALL = [
    "--env",
    "CartPole-v1",
    "--algo",
    "dqn",
    "--num_workers",
    "1",
    "--num_envs_per_worker",
    "8",
    "--learning_starts",
    "500",
    "--seed",
    "1",
]


@pytest.mark.e2e
def test_dqn_learns_cartpole_in_serial_mode(tmp_path, shm_dir):
    """From about 10 (the untrained greedy policy; random play: 22) to a greedy evaluation above 100 within 60,000
    env steps, the replay ratio held. (Not bit-for-bit reproducible: evaluations and the learner's chunks of
    updates are timed, so the threshold leaves room: 139 to over 300 seen.)"""
    result = run_train(
        DQN_SMALL
        + ["--mode", "serial", "--train_for_env_steps", "60000", "--eval_every_sec", "1", "--eval_episodes", "5"]
        + ["--experiment", "dqn", "--shm_dir", shm_dir, "--hidden_size", "64"],
        tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_json(tmp_path / "dqn" / "summary.json")
    assert summary["algo"] == "dqn" and summary["replay_ratio_target"] == 8.0
    assert abs(summary["replay_ratio"] - 8.0) < 0.1, summary["replay_ratio"]
    assert summary["eval_return_best"] > 100, summary["eval_return_best"]
    assert summary["env_step_books"]["inserted_replay"] > 0
    assert os.listdir(shm_dir) == []  # the segment (and its replay buffer) released


@pytest.mark.e2e
def test_pqn_learns_cartpole_in_serial_mode(tmp_path, shm_dir):
    result = run_train(
        ["--env", "CartPole-v1", "--algo", "pqn", "--mode", "serial", "--num_workers", "1"]
        + ["--num_envs_per_worker", "32", "--rollout", "32", "--batch_size", "256", "--seed", "1"]
        + ["--train_for_env_steps", "200000", "--epsilon_decay_env_steps", "50000"]
        + ["--experiment", "pqn", "--shm_dir", shm_dir],
        tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_json(tmp_path / "pqn" / "summary.json")
    assert summary["algo"] == "pqn" and "replay_ratio" not in summary
    assert summary["episode_return_mean"] > 80, summary["episode_return_mean"]  # random play: about 22 (95 to 150 seen)


def _serial_run(tmp_path, shm_dir, *flags):
    from conftest import SerialRun, serial_plan

    plan = serial_plan(tmp_path, shm_dir, "CartPole-v1", "--algo", "dqn", "--learning_starts", "256", *flags)
    return SerialRun(plan, tmp_path)


@pytest.mark.parametrize("ratio", ["0.5", "4", "32"])
def test_the_rate_limiter_holds_the_replay_ratio_in_a_serial_run(tmp_path, shm_dir, ratio):
    """Stepped by hand: whatever the ratio, samples trained stay within one batch of ratio x (inserted - starts),
    and nothing trains before --learning_starts env steps are in."""
    from sf_engine.stats.messages import ReplayStatus

    run = _serial_run(tmp_path, shm_dir, "--replay_ratio", ratio, "--batch_size", "32")
    try:
        limiter = run.learner.source.limiter
        for _ in range(300):
            for worker in run.workers:
                worker.step(0)
            run.policy.step(0)
            run.learner.step(0)
            if limiter.inserted < 256:
                assert limiter.sampled == 0
            else:
                assert limiter.sampled <= float(ratio) * (limiter.inserted - 256) + 1e-9
        assert limiter.inserted > 1000
        assert float(ratio) * (limiter.inserted - 256) - limiter.sampled < 32 + float(ratio) * 64  # a batch, a slot
        statuses = run.messages(ReplayStatus)
        assert statuses and abs(statuses[-1].replay_ratio - float(ratio)) / float(ratio) < 0.25
    finally:
        run.close()


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_dqn_runs_in_sync_and_async_modes(tmp_path, shm_dir, mode):
    """Sync: the learner takes one slot of every split, trains what they allow, publishes, then frees them (so
    the pool is exactly one round); async: one slot at a time. Both hold the ratio and exit cleanly. Uniform
    replay here (classic control's default is prioritized: the other DQN runs sample by priority)."""
    result = run_train(
        DQN_SMALL
        + ["--mode", mode, "--train_for_env_steps", "6000", "--replay_ratio", "2", "--prioritized", "false"]
        + ["--experiment", mode, "--shm_dir", shm_dir],
        tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_json(tmp_path / mode / "summary.json")
    assert abs(summary["replay_ratio"] - 2.0) < 0.2, summary["replay_ratio"]
    assert summary["learner_version"] > 0
    assert summary["env_step_books"]["unaccounted"] == 0, summary["env_step_books"]  # every env step booked
    assert "4 slots" in result.stdout if mode == "async" else "2 slots" in result.stdout, result.stdout
    assert os.listdir(shm_dir) == []


@pytest.mark.e2e
@pytest.mark.parametrize("save_replay", [False, True])
def test_a_resumed_run_refills_or_reloads_its_replay_buffer(tmp_path, shm_dir, save_replay):
    flags = DQN_SMALL + ["--mode", "serial", "--experiment", "resume", "--shm_dir", shm_dir]
    flags += ["--save_replay", str(save_replay).lower()]
    first = run_train(flags + ["--train_for_env_steps", "3000"], tmp_path, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    replay_file = tmp_path / "resume" / "checkpoints" / "replay.npz"
    assert replay_file.exists() == save_replay
    first = read_json(tmp_path / "resume" / "summary.json")
    first_inserted = first["replay_inserted_env_steps"]  # the full slots' steps (a partial one at the stop is not)
    assert first["env_steps"] - 64 < first_inserted <= first["env_steps"]
    if save_replay:
        with np.load(replay_file, allow_pickle=False) as saved:
            assert saved["counters"][2] == first_inserted
    second = run_train(flags + ["--train_for_env_steps", "6000"], tmp_path, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    log = second.stdout + second.stderr
    summary = read_json(tmp_path / "resume" / "summary.json")
    stepped = summary["env_steps"] - first["env_steps"]
    if save_replay:
        assert "replay buffer refilled from" in log
        assert first_inserted + stepped - 64 < summary["replay_inserted_env_steps"] <= first_inserted + stepped
    else:
        assert "refilled from" not in log
        assert stepped - 64 < summary["replay_inserted_env_steps"] <= stepped  # it started empty


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--replay_size", "0"], ["--replay_size", "at least 1"]),
        (["--replay_ratio", "0"], ["--replay_ratio", "positive"]),
        (["--replay_ratio", "nan"], ["--replay_ratio", "finite"]),
        (["--learning_starts", "-1"], ["--learning_starts", ">= 0"]),
        (["--n_step", "0"], ["--n_step", "at least 1"]),
        (["--per_alpha", "-0.5"], ["--per_alpha", ">= 0"]),
        (["--per_beta", "1.5"], ["--per_beta", "[0, 1]"]),
        (["--prioritized", "maybe"], ["--prioritized", "true or false"]),
        (["--save_replay", "2"], ["--save_replay", "true or false"]),
        (["--target_update_period", "0"], ["--target_update_period", "at least 1"]),
        (["--target_tau", "0"], ["--target_tau", "(0, 1]"]),
        (["--huber_delta", "0"], ["--huber_delta", "positive"]),
        (["--epsilon_start", "2"], ["--epsilon_start", "[0, 1]"]),
        (["--epsilon_end", "-0.1"], ["--epsilon_end", "[0, 1]"]),
        (["--epsilon_decay_env_steps", "0"], ["--epsilon_decay_env_steps", "at least 1"]),
        (["--apex_alpha", "-1"], ["--apex_alpha", ">= 0"]),
        (["--lr_end", "-0.0001"], ["--lr_end", ">= 0"]),
        (["--lr_decay_env_steps", "-5"], ["--lr_decay_env_steps", ">= 0"]),
        (["--q_lambda", "1.2"], ["--q_lambda", "[0, 1]"]),
        (["--double_q", "yes please"], ["--double_q", "true or false"]),
        (["--dueling", "x"], ["--dueling", "true or false"]),
        (["--layer_norm", "x"], ["--layer_norm", "true or false"]),
        (["--algo", "a2c"], ["--algo", "invalid choice"]),
        (["--batch_size", "512", "--replay_size", "100"], ["--batch_size", "--replay_size"]),
        (["--replay_size", "64", "--batch_size", "32"], ["--replay_size", "one trajectory slot"]),
        (["--stop_at_eval_return", "475"], ["--stop_at_eval_return", "--eval_every_sec"]),
        (["--rnn", "gru"], ["--rnn gru", "R2D2"]),
        (["--num_policies", "2"], ["--num_policies", "--algo ppo"]),
        (["--normalize_input", "true"], ["--normalize_input", "PPO"]),
        (["--env", "Pendulum-v1"], ["Discrete", "continuous"]),
    ],
)
def test_bad_values_of_the_new_flags_are_one_line_and_touch_nothing(tmp_path, capsys, flags, words):
    assert_refused_untouched(["--algo", "dqn", "--mode", "serial"] + flags, tmp_path, capsys, words)


def test_a_replay_buffer_too_large_for_the_machine_is_one_line(tmp_path, capsys):
    error = train_error(["--algo", "dqn", "--mode", "serial", "--replay_size", "100000000000"], tmp_path, capsys)
    assert "--replay_size" in error and "MiB" in error, error


def test_a_sampler_nodes_slots_enter_the_replay_buffer_like_local_ones(tmp_path, shm_dir):
    """--algo dqn fed by a sampler node alone (sf_engine.scaleout.sampler_node, as Ray's sampler actors run it):
    its slots, written into local ones as the receiver writes them, are inserted, trained on, and learning
    happens. The node lays out no replay buffer of its own."""
    from conftest import SerialRun, receive, serial_plan

    from sf_engine.scaleout.ray_samplers import node_plan
    from sf_engine.scaleout.sampler_node import SamplerNode
    from sf_engine.stats.messages import Episodes

    plan = serial_plan(tmp_path, shm_dir, "CartPole-v1", "--algo", "dqn", "--learning_starts", "500", "--seed", "3")
    head = SerialRun(plan, tmp_path)
    assert any(name.startswith("replay.") for name in head.plan.layout)
    on_node = node_plan(head.plan, 0)
    assert not any(name.startswith("replay.") for name in on_node.layout)
    node = SamplerNode(on_node, str(tmp_path / "node_segment"))
    try:
        learner, feed = head.learner.policies[0], head.learner.source
        returns = []
        for _ in range(3000):
            node.set_weights(0, learner.params.numpy(), learner.version)
            payloads, messages = node.collect(1)
            slots = receive(head, payloads)
            for slot in slots:
                head.learner.pool.hand_over(slot)
            inserted = feed.limiter.inserted + len(slots) * head.cfg.samples_per_slot
            while feed.limiter.inserted < inserted or feed.limiter.can_train():  # insert them, train what they allow
                head.learner.step(0)
            returns += [r for m in messages if isinstance(m, Episodes) for r in m.returns]
            if len(returns) > 20 and np.mean(returns[-20:]) > 100:
                break
        assert feed.limiter.inserted >= 500 and feed.limiter.sampled > 0 and learner.version > 0
        assert np.mean(returns[-20:]) > 100, f"no learning from the node's slots: {np.mean(returns[-20:]):.1f}"
    finally:
        node.close()
        head.close()
