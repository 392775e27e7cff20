"""Whole runs of --algo r2d2: it learns a memory task in serial mode on a small budget (a feed-forward policy cannot
beat a coin flip there); bad values of its flags are one line before anything on disk changes; a resumed run
reloads the saved replay buffer with its stored states; a sampler node's slots enter the buffer with their states;
enjoy.py and export of its recurrent Q-network act greedily, the state fed back."""

import os

import numpy as np
import pytest
import torch
from conftest import assert_refused_untouched, enjoy_episodes, read_json, run_train

TESTS_ON_PATH = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}  # toy_envs:RecallEnv
RECALL = ["--env", "toy_envs:RecallEnv", "--num_workers", "1", "--num_envs_per_worker", "8", "--seed", "1"]
RECALL += ["--rollout", "16", "--burn_in", "4", "--replay_sequence_length", "8", "--learning_starts", "1000"]


@pytest.mark.e2e
def test_r2d2_learns_a_memory_task_in_serial_mode(tmp_path, shm_dir):
    """RecallEnv: the cue is seen two steps before the rewarded action, so only a core that remembers it does
    better than 0.5 on average; R2D2 gets above 0.8 (exploration included; 0.98 seen) within 15,000 env steps."""
    result = run_train(
        ["--algo", "r2d2", "--mode", "serial", "--train_for_env_steps", "15000"]
        + RECALL
        + ["--experiment", "recall", "--shm_dir", shm_dir],
        tmp_path,
        env=TESTS_ON_PATH,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_json(tmp_path / "recall" / "summary.json")
    assert summary["algo"] == "r2d2" and abs(summary["replay_ratio"] - 4.0) < 0.2, summary
    assert summary["episode_return_mean"] > 0.8, summary["episode_return_mean"]
    assert os.listdir(shm_dir) == []


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--algo", "r2d2", "--rnn", "none"], ["--algo r2d2", "--rnn gru"]),
        (["--algo", "r2d2", "--burn_in", "-1"], ["--burn_in", ">= 0"]),
        (["--algo", "r2d2", "--burn_in", "x"], ["--burn_in"]),
        (["--algo", "r2d2", "--replay_sequence_length", "0"], ["--replay_sequence_length", "at least 1"]),
        (["--algo", "r2d2", "--priority_eta", "1.5"], ["--priority_eta", "[0, 1]"]),
        (["--algo", "r2d2", "--priority_eta", "nan"], ["--priority_eta", "finite"]),
        (["--algo", "r2d2", "--value_rescale", "x"], ["--value_rescale", "true or false"]),
        (["--algo", "r2d2", "--rollout", "20"], ["--rollout (20)", "--burn_in", "--replay_sequence_length"]),
        (["--algo", "r2d2", "--rollout", "64", "--burn_in", "40", "--replay_sequence_length", "30"], ["(40 + 30)"]),
        (["--algo", "r2d2", "--actor_critic", "separate"], ["--actor_critic", "r2d2"]),
        (["--algo", "r2d2", "--num_policies", "2"], ["--num_policies", "--algo ppo"]),
        (["--algo", "r2d2", "--env", "Pendulum-v1"], ["Discrete", "continuous"]),
        (["--algo", "dqn", "--value_rescale", "true"], ["--value_rescale", "--algo r2d2"]),
        (["--algo", "dqn", "--rnn", "lstm"], ["--rnn lstm", "R2D2", "--algo r2d2"]),
    ],
)
def test_bad_values_of_the_r2d2_flags_are_one_line_and_touch_nothing(tmp_path, capsys, flags, words):
    assert_refused_untouched(["--env", "CartPoleNoVel-v1", "--mode", "serial"] + flags, tmp_path, capsys, words)


@pytest.mark.e2e
def test_a_resumed_r2d2_run_reloads_its_replay_buffer_with_the_stored_states(tmp_path, shm_dir):
    flags = ["--algo", "r2d2", "--mode", "serial", "--experiment", "resume", "--shm_dir", shm_dir]
    flags += RECALL + ["--save_replay", "true"]
    first = run_train(flags + ["--train_for_env_steps", "3000"], tmp_path, env=TESTS_ON_PATH)
    assert first.returncode == 0, first.stdout + first.stderr
    replay_file = tmp_path / "resume" / "checkpoints" / "replay.npz"
    with np.load(replay_file, allow_pickle=False) as saved:
        filled = int(saved["counters"][1])
        starts, states = saved["episode_start"][:filled], saved["rnn_states"][:filled]
        assert filled > 0 and states.shape[1:] == (17, 64)  # T + 1 rows of the GRU's state
        acted = np.abs(states[:, :-1]).sum(axis=2)  # rows 0..T-1 (row T's is stored before its zeroing)
        assert starts[:, 1:-1].any() and acted[starts[:, :-1]].max() == 0  # zeroed where an episode starts
        assert np.abs(states[:, 1:]).max() > 0  # the core's states, not zeros
    second = run_train(flags + ["--train_for_env_steps", "6000"], tmp_path, env=TESTS_ON_PATH)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "replay buffer refilled from" in second.stdout + second.stderr
    summary = read_json(tmp_path / "resume" / "summary.json")
    assert summary["replay_inserted_env_steps"] > 3000 and summary["learner_version"] > 0


def test_a_sampler_nodes_slots_enter_the_replay_buffer_with_their_states(tmp_path, shm_dir):
    """--algo r2d2 fed by a sampler node (as Ray's sampler actors run it): the slots written into local ones are
    inserted with the recurrent states the node's policy worker acted from, and trained on."""
    from conftest import SerialRun, receive, serial_plan

    from sf_engine.scaleout.sampler_node import SamplerNode

    plan = serial_plan(
        tmp_path, shm_dir, "CartPoleNoVel-v1", "--algo", "r2d2", "--rollout", "32", "--learning_starts", "256"
    )
    head = SerialRun(plan, tmp_path)
    node = SamplerNode(head.plan, str(tmp_path / "node_segment"))
    try:
        learner, feed = head.learner.policies[0], head.learner.source
        for _ in range(200):
            node.set_weights(0, learner.params.numpy(), learner.version)
            payloads, _ = node.collect(1)
            slots = receive(head, payloads)
            states = [head.buffers.rnn_states[slot].copy() for slot in slots]
            for slot in slots:
                head.learner.pool.hand_over(slot)
            inserted = feed.limiter.inserted + len(slots) * head.cfg.samples_per_slot
            while feed.limiter.inserted < inserted or feed.limiter.can_train():
                head.learner.step(0)
            if learner.version > 2:
                break
        envs = head.cfg.sampler.envs_per_split
        column = (int(feed.buffer.counters[0]) - envs) % feed.buffer.columns  # the last slot's first column
        np.testing.assert_array_equal(feed.buffer.arrays["rnn_states"][column], states[-1][:, 0])
        assert np.abs(states[-1]).max() > 0 and feed.limiter.sampled > 0 and learner.version > 2
    finally:
        node.close()
        head.close()


@pytest.mark.e2e
@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_enjoy_and_export_of_a_recurrent_q_network_act_greedily(tmp_path, shm_dir, capsys):
    """A tiny CartPoleNoVel run of --algo r2d2 --rnn lstm: enjoy.py replays it greedily (the same episodes with and
    without --deterministic), and the exported ONNX and TorchScript files, their state fed back and zeroed where
    an episode starts, give the model's greedy actions, values (returns: h^-1 of the Q-values) and states."""
    import onnxruntime

    from sf_engine.model.q_network import QNetwork, inverse_value_rescale
    from sf_engine.play.export import main as export_main
    from sf_engine.play.loading import load_experiment, load_policy, resolve_checkpoint
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    where = ["--train_dir", str(tmp_path), "--experiment", "r2d2"]
    flags = ["--algo", "r2d2", "--env", "CartPoleNoVel-v1", "--rnn", "lstm", "--mode", "serial", "--num_workers", "1"]
    flags += ["--num_envs_per_worker", "8", "--train_for_env_steps", "3000", "--learning_starts", "500"]
    assert run(build_plan(flags + ["--shm_dir", shm_dir] + where)) == 0
    assert read_json(tmp_path / "r2d2" / "summary.json")["learner_version"] > 0
    capsys.readouterr()
    assert enjoy_episodes(capsys, *where) == enjoy_episodes(capsys, *where, "--deterministic")

    assert export_main(where) == 0
    cfg, spec, exp_dir = load_experiment(str(tmp_path), "r2d2")
    model = load_policy(cfg, spec, resolve_checkpoint(exp_dir, "r2d2", "latest"), "cpu")
    assert isinstance(model, QNetwork) and model.recurrent and model.state_size == 128
    export_dir = tmp_path / "r2d2" / "export"
    assert read_json(export_dir / "policy.json")["recurrent"]
    scripted = torch.jit.load(str(export_dir / "policy.torchscript.pt"))
    session = onnxruntime.InferenceSession(str(export_dir / "policy.onnx"))
    rng = np.random.default_rng(0)
    state = model.initial_state(16)
    onnx_state, script_state = state.numpy(), state
    actions_seen = []
    for t in range(6):
        obs = (rng.normal(size=(16, 2)) * [1.0, 0.1]).astype(np.float32)
        if t == 3:  # rows 0..7 start an episode: every copy of the state zeroed there
            state[:8], onnx_state[:8], script_state[:8] = 0.0, 0.0, 0.0
        with torch.no_grad():
            q, _, state = model.outputs({"obs": torch.from_numpy(obs)}, state)
            script_action, script_value, script_state = scripted(torch.from_numpy(obs), script_state)
        onnx_action, onnx_value, onnx_state = session.run(None, {"obs": obs, "state": onnx_state})
        greedy, value = q.argmax(dim=1).numpy(), inverse_value_rescale(q.max(dim=1).values).numpy()
        assert (script_action.numpy() == greedy).all() and (onnx_action == greedy).all()
        np.testing.assert_allclose(script_value.numpy(), value, rtol=1e-3, atol=1e-3)  # h^-1 magnifies rounding
        np.testing.assert_allclose(onnx_value, value, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(onnx_state, state.numpy(), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(script_state, state, rtol=1e-4, atol=1e-5)
        actions_seen += greedy.tolist()
    assert 0 < np.mean(actions_seen) < 1  # both actions: the comparison means something
