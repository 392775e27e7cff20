"""Recurrent policies: state resets at episode boundaries, acting and training agree, whole sequences."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO, SerialRun, compiled_kernels_expected, read_json, run_train, serial_plan

from sf_engine.algo import targets
from sf_engine.algo.ppo import loss as ppo_loss
from sf_engine.envs import make_batch_env, probe_env_spec
from sf_engine.model.actor_critic import ActorCritic
from sf_engine.model.recurrent import run_sequence
from sf_engine.run.plan import build_plan


def recurrent_model(rnn, actor_critic="shared"):
    plan = build_plan(
        [
            "--env",
            "CartPoleNoVel-v1",
            "--rnn",
            rnn,
            "--rnn_size",
            "8",
            "--actor_critic",
            actor_critic,
            "--mode",
            "serial",
            "--restart",
        ]
    )  # --restart: reads no experiment
    torch.manual_seed(0)
    return ActorCritic(plan.spec, plan.cfg.model)


@pytest.mark.parametrize("rnn, actor_critic", [("gru", "shared"), ("lstm", "shared"), ("gru", "separate")])
def test_state_resets_at_episode_boundaries(rnn, actor_critic):
    """A done in the middle of a hand-built trajectory: the steps after it see a zero state, whether
    the core is re-run as one sequence (learning) or stepped one step at a time (acting)."""
    model = recurrent_model(rnn, actor_critic)
    steps, batch = 6, 3
    obs = torch.randn(steps, batch, 2)
    start = torch.zeros(steps, batch, dtype=torch.bool)
    start[3, 0] = True  # trajectory 0: an episode starts at step 3
    start[0, 2] = True  # trajectory 2: starts one at step 0 (its stored state must be ignored)
    state0 = torch.randn(batch, model.state_size)
    with torch.no_grad():
        params, values, _ = model.forward_sequence({"obs": obs.reshape(-1, 2)}, state0, start)
        params, values = params.view(steps, batch, -1), values.view(steps, batch)
        # acting: one step at a time, zeroing the state where an episode starts
        state = state0.clone()
        for t in range(steps):
            state = state * (~start[t]).unsqueeze(-1)
            step_params, step_values, state = model({"obs": obs[t]}, state)
            torch.testing.assert_close(step_params, params[t], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(step_values, values[t], rtol=1e-5, atol=1e-5)
        # the second episode of trajectory 0 equals a fresh trajectory from a zero state
        fresh_params, _, _ = model.forward_sequence(
            {"obs": obs[3:, :1].reshape(-1, 2)}, torch.zeros(1, model.state_size), torch.zeros(3, 1, dtype=torch.bool)
        )
        torch.testing.assert_close(fresh_params, params[3:, 0], rtol=1e-5, atol=1e-5)
        # and its first episode depends on the stored state, the reset trajectory 2 does not
        other, _, _ = model.forward_sequence({"obs": obs.reshape(-1, 2)}, torch.zeros_like(state0), start)
        other = other.view(steps, batch, -1)
        assert not torch.allclose(other[:3, 0], params[:3, 0])
        torch.testing.assert_close(other[3:, 0], params[3:, 0])
        torch.testing.assert_close(other[:, 2], params[:, 2])


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
def test_the_policy_workers_states_match_the_learners_recomputation(tmp_path, shm_dir, rnn):
    plan = serial_plan(
        tmp_path,
        shm_dir,
        "CartPoleNoVel-v1",
        "--rnn",
        rnn,
        "--rollout",
        "32",
        "--batch_size",
        "64",
        "--num_batches_per_epoch",
        "1",
    )
    cfg, roles = plan.cfg, SerialRun(plan, tmp_path)
    slots = roles.full_slots(cfg.slots_per_batch)[: cfg.slots_per_batch]
    batch = roles.learner.source.gather(slots)  # acted with version 0, which the learner still has (no lag)
    model = roles.learner.model
    starts = batch.episode_start[:-1]
    assert starts[1:].any()  # episodes started inside the slots (random CartPole episodes are short)
    with torch.no_grad():
        params, values, outputs = model.forward_sequence(
            {k: v[:-1].reshape(-1, *v.shape[2:]) for k, v in batch.obs.items()}, batch.rnn_states[0], starts
        )
        log_probs, _ = model.log_prob_entropy(params, batch.actions.reshape(-1))
    torch.testing.assert_close(log_probs.view_as(batch.log_probs), batch.log_probs, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(
        model.denormalize_values(values).view_as(batch.values), batch.values, rtol=1e-4, atol=1e-5
    )
    # the state the policy worker acted from at step t + 1 is the core's output at step t (rows 1..T-1
    # zeroed where an episode starts; row T, the bootstrap row's, is stored before that zeroing)
    size = outputs.shape[-1]
    acted_from = batch.rnn_states[1:, :, :size]
    continuing = ~batch.episode_start[1:]
    continuing[-1] = True
    torch.testing.assert_close(acted_from[continuing], outputs[continuing], rtol=1e-4, atol=1e-5)
    # GAE's bootstrap value, one step from the stored row-T state, is the value of re-running the
    # core over all T + 1 rows
    with torch.no_grad():
        _, all_values, _ = model.forward_sequence(
            {k: v.reshape(-1, *v.shape[2:]) for k, v in batch.obs.items()},
            batch.rnn_states[0],
            batch.episode_start,
        )
    bootstrap = model.denormalize_values(all_values.view(len(starts) + 1, -1)[-1])
    advantages, returns = roles.learner.policies[0].algorithm._targets(batch)
    recomputed, _ = targets.gae(
        batch.rewards,
        torch.cat([batch.values, bootstrap.unsqueeze(0)]),
        batch.terminated,
        batch.terminated | batch.truncated,
        batch.valid,
        roles.learner.policies[0].algorithm.lcfg.gamma,
        roles.learner.policies[0].algorithm.cfg.ppo.gae_lambda,
    )
    torch.testing.assert_close(advantages, recomputed, rtol=1e-4, atol=1e-5)
    assert (batch.rnn_states[:-1][starts] == 0).all()  # zeroed where an episode starts
    roles.close()


def test_sequences_are_never_split_across_minibatches(tmp_path, shm_dir):
    plan = serial_plan(
        tmp_path,
        shm_dir,
        "CartPoleNoVel-v1",
        "--rnn",
        "gru",
        "--rollout",
        "16",
        "--recurrence",
        "4",
        "--batch_size",
        "64",
        "--num_batches_per_epoch",
        "3",
        "--num_epochs",
        "2",
    )
    cfg, roles = plan.cfg, SerialRun(plan, tmp_path)
    slots = roles.full_slots(cfg.slots_per_batch)[: cfg.slots_per_batch]
    batch = roles.learner.source.gather(slots)
    steps, trajectories = batch.rewards.shape
    # tag every sample with its place: obs = (t, n)
    t_grid, n_grid = torch.meshgrid(torch.arange(steps + 1.0), torch.arange(trajectories * 1.0), indexing="ij")
    batch.obs = {"obs": torch.stack([t_grid, n_grid], dim=-1)}
    keep = torch.ones(steps, trajectories, dtype=torch.bool)
    seq = roles.learner.policies[0].algorithm._sequences(
        batch, keep, torch.zeros(steps, trajectories), torch.zeros(steps, trajectories)
    )
    seen = []
    model = roles.learner.model
    original = model.forward_sequence

    def spy(obs, state, episode_start):
        tags = obs["obs"].view(episode_start.shape[0], episode_start.shape[1], 2)
        assert episode_start.shape[0] == 4  # --recurrence
        for column in range(tags.shape[1]):
            t, n = tags[:, column, 0], tags[:, column, 1]
            assert (n == n[0]).all() and (t == t[0] + torch.arange(4)).all() and int(t[0]) % 4 == 0
            seen.append((int(t[0]), int(n[0])))
        return original(obs, state, episode_start)

    model.forward_sequence = spy
    roles.learner.policies[0].algorithm._ppo_epochs_recurrent(seq)
    chunks = {(t, n) for t in range(0, steps, 4) for n in range(trajectories)}
    assert sorted(seen) == sorted(list(chunks) * 2)  # every sequence whole, once per epoch
    index = ppo_loss.sequence_index(steps, trajectories, 4)
    assert sorted(index.reshape(-1).tolist()) == list(range(steps * trajectories))
    roles.close()


def test_cartpole_novel_observes_position_and_angle_only():
    spec = probe_env_spec("CartPoleNoVel-v1", "auto")
    assert spec.obs == (("obs", (2,), "float32"),)
    full = make_batch_env("CartPole-v1", "auto", 3, 5, probe_env_spec("CartPole-v1", "auto"))
    masked = make_batch_env("CartPoleNoVel-v1", "auto", 3, 5, spec)
    np.testing.assert_array_equal(masked.reset()["obs"], full.reset()["obs"][:, [0, 2]])
    actions = np.array([0, 1, 1])
    np.testing.assert_array_equal(masked.step(actions).obs["obs"], full.step(actions).obs["obs"][:, [0, 2]])


@pytest.mark.e2e
def test_recurrent_run_trains_resumes_and_replays(tmp_path, shm_dir):
    args = [
        "--env",
        "CartPoleNoVel-v1",
        "--rnn",
        "lstm",
        "--experiment",
        "rnn",
        "--shm_dir",
        shm_dir,
        "--num_workers",
        "2",
        "--num_envs_per_worker",
        "32",
        "--batch_size",
        "512",
        "--eval_every_sec",
        "2",
        "--eval_episodes",
        "2",
    ]
    first = run_train(args + ["--train_for_env_steps", "40000"], tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    summary = read_json(tmp_path / "rnn" / "summary.json")
    assert summary["learner_version"] > 5 and summary["env_step_books"]["unaccounted"] == 0
    # 20,000 env steps more: the budget is checked every quarter second, so the first run may pass 40,000
    second = run_train(args + ["--train_for_env_steps", str(summary["env_steps"] + 20_000)], tmp_path)
    assert second.returncode == 0 and "resuming experiment rnn" in second.stdout
    replay = subprocess.run(
        [
            sys.executable,
            f"{REPO}/enjoy.py",
            "--train_dir",
            str(tmp_path),
            "--experiment",
            "rnn",
            "--num_episodes",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "return" in replay.stdout


def _stepped_reference(kind, module, x, state, episode_start):
    """nn.GRU / nn.LSTM stepped one step at a time, the state zeroed where an episode starts:
    [T, B, S] states after each step (h, or h and c)."""
    size, outputs = module.hidden_size, []
    for t in range(x.shape[0]):
        state = state * (~episode_start[t]).to(x.dtype).unsqueeze(-1)
        if kind == "gru":
            _, h = module(x[t : t + 1], state.unsqueeze(0))
            state = h[0]
        else:
            _, (h, c) = module(
                x[t : t + 1], (state[:, :size].unsqueeze(0).contiguous(), state[:, size:].unsqueeze(0).contiguous())
            )
            state = torch.cat([h[0], c[0]], dim=-1)
        outputs.append(state)
    return torch.stack(outputs)


def _require_compiled_loops(recurrent) -> None:
    """Fail if the compiled loops are missing where setup.py builds them (x86-64, glibc >= 2.35);
    skip elsewhere, where sf_engine runs the Python loops by design."""
    if recurrent.NATIVE is None and not compiled_kernels_expected():
        pytest.skip("the compiled loops are built only on x86-64 with glibc >= 2.35")
    assert recurrent.NATIVE is not None, "the compiled loops are not built: pip install --no-build-isolation -e ."


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_an_acting_step_matches_the_training_sequences_step(kind):
    """Acting (no gradients) takes torch's fused cell; it gives the sequence loops' state for one step."""
    from sf_engine.model.recurrent import RecurrentCore

    torch.manual_seed(2)
    core = RecurrentCore(kind, 7, 16)
    x, state = torch.randn(5, 7), torch.randn(5, core.state_size)
    with torch.no_grad():
        out, new_state = core.step(x, state)
        expected = run_sequence(kind, x.unsqueeze(0), state, None, core.weights)[0]  # the sequence loops
    torch.testing.assert_close(out, expected[:, :16], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(new_state, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("loops", ["native", "torch"])
def test_the_written_out_core_matches_nn_gru_and_lstm(kind, loops, monkeypatch):
    """sf_engine.model.recurrent's forward and backward (the compiled loops, and the torch loops that CUDA,
    other dtypes and builds without the compiled loops run) give nn.GRU's / nn.LSTM's outputs and
    gradients, resets included, in double precision; the autograd node passes gradcheck with each."""
    from sf_engine.model import recurrent

    if loops == "native":
        _require_compiled_loops(recurrent)
    else:  # as where the compiled loops are not built
        monkeypatch.setattr(recurrent, "NATIVE", None)
    torch.manual_seed(1)
    steps, batch, features, size = 9, 6, 5, 4
    module = (torch.nn.GRU if kind == "gru" else torch.nn.LSTM)(features, size).double()
    x = torch.randn(steps, batch, features, dtype=torch.double, requires_grad=True)
    state = torch.randn(batch, size * (1 if kind == "gru" else 2), dtype=torch.double, requires_grad=True)
    episode_start = torch.rand(steps, batch) < 0.25
    episode_start[0, 0] = episode_start[4, :] = True  # a reset at step 0 and one of every sequence
    weights = (module.weight_ih_l0, module.weight_hh_l0, module.bias_ih_l0, module.bias_hh_l0)
    reference = _stepped_reference(kind, module, x, state, episode_start)
    keep = (~episode_start).double().unsqueeze(-1)
    resets = episode_start.any(dim=1).tolist()
    forward = recurrent.gru_forward if kind == "gru" else recurrent.lstm_forward
    backward = recurrent.gru_backward if kind == "gru" else recurrent.lstm_backward
    with torch.no_grad():
        out, *saved = forward(x, state, keep, resets, *weights, loops=loops)
    torch.testing.assert_close(out, reference, rtol=1e-10, atol=1e-12)
    grad_out = torch.randn_like(out)
    expected = torch.autograd.grad((reference * grad_out).sum(), (x, state) + weights)
    with torch.no_grad():
        grads = backward(grad_out, x, state, keep, resets, weights[0], weights[1], out, *saved, loops=loops)
    for got, want, name in zip(grads, expected, ("x", "state", "w_ih", "w_hh", "b_ih", "b_hh")):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11, msg=f"gradient of {name}")
    assert recurrent.loops_for(x) == loops  # the autograd node as the learner calls it
    assert torch.autograd.gradcheck(
        lambda x, state, *w: recurrent.run_sequence(kind, x, state, episode_start, w), (x, state) + weights
    )
    with pytest.raises(ValueError, match="loops must be"):
        recurrent.loops_for(x, "numpy")


def test_the_compiled_loops_are_built_and_taken():
    """`make` builds the compiled loops (setup.py); CPU float32/float64 take them, other dtypes the
    torch loops. In float32, on a learner-sized minibatch, they give nn.GRU's / nn.LSTM's outputs and
    gradients."""
    from sf_engine.model import recurrent

    _require_compiled_loops(recurrent)
    assert [
        recurrent.loops_for(torch.zeros(1, dtype=dtype))
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16)
    ] == ["native", "native", "torch", "torch"]
    torch.manual_seed(3)
    steps, batch, features, size = 16, 32, 64, 64
    for kind, nn_class in (("gru", torch.nn.GRU), ("lstm", torch.nn.LSTM)):
        module = nn_class(features, size)
        x = torch.randn(steps, batch, features, requires_grad=True)
        state = torch.randn(batch, size * (1 if kind == "gru" else 2), requires_grad=True)
        episode_start = torch.rand(steps, batch) < 0.1
        weights = (module.weight_ih_l0, module.weight_hh_l0, module.bias_ih_l0, module.bias_hh_l0)
        reference = _stepped_reference(kind, module, x, state, episode_start)
        out = recurrent.run_sequence(kind, x, state, episode_start, weights)
        torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)
        grad_out = torch.randn_like(out)
        for got, want in zip(
            torch.autograd.grad((out * grad_out).sum(), (x, state) + weights),
            torch.autograd.grad((reference * grad_out).sum(), (x, state) + weights),
        ):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        with torch.no_grad():  # acting: one step, no resets
            no_starts = torch.zeros(1, batch, dtype=torch.bool)
            torch.testing.assert_close(
                recurrent.run_sequence(kind, x[:1], state, None, weights),
                _stepped_reference(kind, module, x[:1], state, no_starts),
                rtol=1e-5,
                atol=1e-6,
            )
    gi, h0 = torch.zeros(2, 3, 3 * size), torch.zeros(3, size + 1)  # the ops check shapes: they read raw memory
    with pytest.raises(RuntimeError, match="h0 must have shape"):
        recurrent.NATIVE.gru_forward(gi, h0, None, torch.zeros(size, 3 * size), torch.zeros(3 * size))
