"""R2D2 (--algo r2d2) in pieces: value rescaling and its inverse, sequence priorities, the recurrent Q-network's
unrolled sequences against its acting steps, sequences cut from a hand-made slot (their stored states, burn-in and
episode starts, which sequences may be sampled and where their priorities sit), and the learner's targets and
update against references written here."""

import dataclasses

import numpy as np
import pytest
import torch

from sf_engine.algo.base import TrainingHooks
from sf_engine.algo.batch import SequenceBatch
from sf_engine.algo.r2d2.learning import R2D2
from sf_engine.algo.value_targets import sequence_priorities
from sf_engine.config.checks import check_flags, check_resolved
from sf_engine.config.groups import Config, ConfigError, LearnerConfig, ModelConfig, SamplerConfig
from sf_engine.config.value import ReplayConfig
from sf_engine.envs import ActionSpec, EnvSpec
from sf_engine.model.q_network import inverse_value_rescale, value_rescale
from sf_engine.replay.buffer import ReplayBuffer
from sf_engine.replay.layout import replay_layout, replay_prefix
from sf_engine.replay.sequences import Sequences, SequenceShape, sequences_trainable
from sf_engine.replay.transform import SlotSteps, transform_class
from sf_engine.run.plan import build_plan

HOOKS = TrainingHooks(env_steps=lambda: 0, beat=lambda: None, stopping=lambda: False, elapsed_sec=lambda: 0.0)


def test_value_rescaling_known_values_and_round_trip():
    x = torch.tensor([0.0, 3.0, -3.0, 8.0, 99.0], dtype=torch.float64)
    expected = torch.tensor([0.0, 1.003, -1.003, 2.008, 9.099], dtype=torch.float64)  # sqrt(|x|+1) - 1 + x/1000
    torch.testing.assert_close(value_rescale(x), expected)
    wide = torch.cat([torch.linspace(-1e4, 1e4, 20001, dtype=torch.float64), torch.linspace(-2, 2, 401).double()])
    torch.testing.assert_close(inverse_value_rescale(value_rescale(wide)), wide, rtol=1e-9, atol=1e-7)
    torch.testing.assert_close(value_rescale(inverse_value_rescale(wide / 100)), wide / 100, rtol=1e-9, atol=1e-9)
    assert (value_rescale(wide[:20001]).diff() > 0).all()  # monotone: an argmax is the same in either scale


def test_sequence_priorities_mix_max_and_mean_over_trainable_steps():
    td = torch.tensor([[1.0, 5.0, 2.0], [2.0, 1.0, 9.0], [3.0, 0.0, 7.0]])  # [L = 3, B = 3]
    trainable = torch.tensor([[True, True, False], [True, True, False], [True, False, False]])
    priorities = sequence_priorities(td, trainable, 0.9)
    # sequence 0: max 3, mean 2; sequence 1: its untrainable step (0) is left out, max 5, mean 3; sequence 2: none
    torch.testing.assert_close(priorities, torch.tensor([0.9 * 3 + 0.1 * 2, 0.9 * 5 + 0.1 * 3, 0.0]))
    torch.testing.assert_close(sequence_priorities(td, trainable, 0.0)[:2], torch.tensor([2.0, 3.0]))


def r2d2_plan(tmp_path, *flags):
    return build_plan(
        ["--algo", "r2d2", "--env", "CartPoleNoVel-v1", "--mode", "serial", "--train_dir", str(tmp_path)]
        + ["--num_workers", "1", "--num_envs_per_worker", "8", "--hidden_size", "16", "--rnn_size", "8"]
        + list(flags)
    )


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
def test_the_unrolled_q_network_matches_its_acting_steps(tmp_path, rnn):
    """q_sequence (training) over a window with an episode start inside, against q_step one step at a time with
    the state zeroed there (acting); rows after the start do not depend on the state before it."""
    plan = r2d2_plan(tmp_path, "--rnn", rnn)
    torch.manual_seed(0)
    model = R2D2(plan.cfg, plan.spec, torch.device("cpu"), HOOKS).model
    steps, batch = 7, 3
    obs = torch.randn(steps, batch, 2)
    starts = torch.zeros(steps, batch, dtype=torch.bool)
    starts[4, 1] = True
    state0 = torch.randn(batch, model.state_size)
    with torch.no_grad():
        q, _ = model.q_sequence({"obs": obs.reshape(-1, 2)}, state0, starts)
        state = state0
        for t in range(steps):
            state = state * (~starts[t]).unsqueeze(-1)
            q_t, state = model.q_step({"obs": obs[t]}, state)
            torch.testing.assert_close(q_t, q[t], rtol=1e-5, atol=1e-5)
        other, _ = model.q_sequence({"obs": obs.reshape(-1, 2)}, torch.zeros_like(state0), starts)
    assert not torch.allclose(other[:4, 1], q[:4, 1])
    torch.testing.assert_close(other[4:, 1], q[4:, 1])


T, E, H = 12, 2, 3  # rollout, envs, state size
SHAPE = SequenceShape(burn_in=2, length=4, n_step=2)  # starts at rows 2, 4, 6, 8


def sequence_buffer(prioritized: bool) -> ReplayBuffer:
    cfg = Config(
        learner=LearnerConfig(algo="r2d2"),
        sampler=SamplerConfig(rollout=T),
        model=ModelConfig(rnn="gru"),
        replay=ReplayConfig(replay_size=4 * T, prioritized=prioritized, n_step=SHAPE.n_step),
    )
    spec = EnvSpec(obs=(("obs", (2,), "float32"),), action=ActionSpec("discrete", nvec=(3,)))
    arrays = {
        name.removeprefix(replay_prefix(0)): np.zeros(shape, dtype)
        for name, (shape, dtype) in replay_layout(cfg, spec, H).items()
    }
    return ReplayBuffer(arrays, Sequences(0.9, SHAPE), prioritized, 0.6, seed=0)


def hand_made_slot():
    """Env 0: terminated at step 5, its reset step 6 (valid False), a new episode from obs row 7; env 1: no step
    trainable before row 10 (an absent agent). Obs, states and actions name their (row, env)."""
    rows, envs = np.meshgrid(np.arange(T + 1), np.arange(E), indexing="ij")
    obs = {"obs": np.stack([rows, envs], axis=-1).astype(np.float32)}
    states = (10 * rows + envs)[..., None] + np.arange(H) / 10.0  # [T+1, E, H]
    starts = np.zeros((T + 1, E), bool)
    starts[7, 0] = True
    terminated, valid = np.zeros((T, E), bool), np.ones((T, E), bool)
    terminated[5, 0], valid[6, 0], valid[:10, 1] = True, False, False
    rewards = np.ones((T, E), np.float32)
    actions = (rows[:T] + envs[:T]) % 3
    return obs, actions, rewards, terminated, np.zeros((T, E), bool), valid, rows[:T] * 0, states, starts


@pytest.mark.parametrize("prioritized", [False, True])
def test_sequences_are_cut_with_their_stored_states_burn_in_and_episode_starts(prioritized):
    buffer = sequence_buffer(prioritized)
    slot = hand_made_slot()
    buffer.insert(SlotSteps(*slot[:7], rnn_states=slot[7].astype(np.float32), episode_start=slot[8]))
    obs, states, starts, valid = slot[0]["obs"], slot[7], slot[8], slot[5]
    if prioritized:  # priorities only at the starts of sequences that hold a trainable step
        leaves = buffer.tree.priorities(np.arange(2 * T)).reshape(E, T)
        np.testing.assert_array_equal(np.flatnonzero(leaves[0]), [2, 4, 6, 8])
        np.testing.assert_array_equal(np.flatnonzero(leaves[1]), [8])  # steps 10, 11 in [8, 12) only
    sample = buffer.sample(256, beta=0.5)
    columns, first = np.divmod(sample.indices, T)
    assert set(zip(columns.tolist(), first.tolist())) == {(0, 2), (0, 4), (0, 6), (0, 8), (1, 8)}
    assert sample.obs["obs"].shape == (SHAPE.window, 256, 2) and sample.actions.shape == (SHAPE.length, 256)
    for b, (env, start) in enumerate(zip(columns, first)):
        window = np.minimum(np.arange(start - 2, start + 6), T)  # burn-in 2, 4 steps, n-step 2, clipped to row T
        np.testing.assert_array_equal(sample.obs["obs"][:, b], obs[window, env])
        np.testing.assert_array_equal(sample.initial_state[b], states[start - 2, env].astype(np.float32))
        np.testing.assert_array_equal(sample.episode_start[:, b], starts[window, env])
        trained = np.arange(start, start + 4)
        np.testing.assert_array_equal(sample.actions[:, b], slot[1][trained, env])
        np.testing.assert_array_equal(sample.trainable[:, b], buffer.arrays["trainable"][env, trained])
        assert not sample.trainable[:, b].any() or valid[trained, env].any()
    crossing = (columns == 0) & (first == 6)  # the window of rows 4..11 holds the episode start at row 7
    assert crossing.any() and sample.episode_start[3, crossing].all()
    assert not sample.trainable[0, crossing].any()  # step 6, the reset step


def accepted(cfg: Config) -> bool:
    """Whether the configuration's checks (its replay transform's among them) let `cfg` run."""
    try:
        check_flags(cfg)
        check_resolved(cfg)
        transform_class(cfg).check(cfg)
    except ConfigError:
        return False
    return True


def test_every_step_after_the_burn_in_lies_in_a_sampleable_sequence(tmp_path):
    """For every (--rollout, --burn_in, --replay_sequence_length) of a grid that the checks accept, R2D2's 128, 40,
    80 among them: a column whose one trainable step is row t holds a sampleable sequence for every t from
    --burn_in to the slot's end (only the first --burn_in rows serve as burn-in alone); every sequence lies within
    its column with its burn-in, and consecutive starts are at most L/2 apart."""
    cfg = r2d2_plan(tmp_path).cfg
    checked = covered = 0
    for rollout in (2, 3, 5, 8, 16, 17, 31, 64, 100, 120, 127, 128):
        for burn_in in (0, 1, 2, 7, 8, 40):
            for length in (1, 2, 3, 5, 16, 17, 80):
                case = dataclasses.replace(
                    cfg,
                    sampler=dataclasses.replace(cfg.sampler, rollout=rollout),
                    replay=dataclasses.replace(cfg.replay, burn_in=burn_in, replay_sequence_length=length),
                )
                checked += 1
                if not accepted(case):
                    continue
                covered += 1
                starts = SequenceShape(burn_in, length, case.replay.n_step).starts(rollout)
                where = (rollout, burn_in, length, starts.tolist())
                assert starts[0] == burn_in and starts[-1] + length <= rollout, where
                assert (np.diff(starts) >= 1).all() and (np.diff(starts) <= max(length // 2, 1)).all(), where
                only_row = np.eye(rollout, dtype=bool)  # column t: only its step t is trainable
                sampleable = sequences_trainable(only_row, starts, length).any(axis=1)
                np.testing.assert_array_equal(sampleable, np.arange(rollout) >= burn_in, err_msg=str(where))
    assert 0 < covered < checked and accepted(
        dataclasses.replace(
            cfg,
            sampler=dataclasses.replace(cfg.sampler, rollout=128),
            replay=dataclasses.replace(cfg.replay, burn_in=40, replay_sequence_length=80),
        )
    )


def sequence_batch(spec, model, rng, sequences=5, burn_in=3, length=4, n_step=2) -> SequenceBatch:
    """Random observations over a window of burn_in + length + n_step rows, an episode start inside (sequence 0
    at the sequence's second step, sequence 1 in the burn-in), n-step data as the buffer gives it."""
    window = burn_in + length + n_step
    starts = torch.zeros(window, sequences, dtype=torch.bool)
    starts[burn_in + 1, 0], starts[1, 1] = True, True
    steps = torch.from_numpy(rng.integers(1, n_step + 1, (length, sequences)))
    terminal = torch.from_numpy(rng.random((length, sequences)) < 0.2)
    return SequenceBatch(
        obs={"obs": torch.from_numpy(rng.normal(size=(window, sequences, 2)).astype(np.float32))},
        episode_start=starts,
        initial_state=torch.randn(sequences, model.state_size),
        actions=torch.from_numpy(rng.integers(0, 2, (length, sequences))),
        returns=torch.from_numpy(rng.normal(size=(length, sequences)).astype(np.float32) * 5),
        steps=steps,
        discounts=torch.where(terminal, 0.0, 0.99**steps).float(),
        trainable=torch.from_numpy(rng.random((length, sequences)) < 0.8),
        weights=torch.from_numpy(rng.uniform(0.2, 1.0, sequences).astype(np.float32)),
        burn_in=burn_in,
    )


def stepped_q(net, batch) -> np.ndarray:
    """[W, B, A] Q-values of `net` stepped row by row over the whole window from the stored state, zeroed where an
    episode starts (as acting does)."""
    state, rows = batch.initial_state, []
    with torch.no_grad():
        for t in range(batch.episode_start.shape[0]):
            state = state * (~batch.episode_start[t]).unsqueeze(-1)
            q, state = net.q_step({"obs": batch.obs["obs"][t]}, state)
            rows.append(q.numpy())
    return np.stack(rows).astype(np.float64)


@pytest.mark.parametrize("rescale", [True, False])
def test_the_learners_targets_against_a_reference(tmp_path, rescale):
    plan = r2d2_plan(tmp_path, "--value_rescale", str(rescale).lower(), "--target_update_period", "1")
    torch.manual_seed(0)
    r2d2 = R2D2(plan.cfg, plan.spec, torch.device("cpu"), HOOKS)
    with torch.no_grad():  # a target network unlike the online one: double Q's two roles are told apart
        r2d2.target_params.add_(torch.randn_like(r2d2.target_params) * 0.3)
    batch = sequence_batch(plan.spec, r2d2.model, np.random.default_rng(1))
    online, target = stepped_q(r2d2.model, batch), stepped_q(r2d2.target, batch)

    def h(x):
        return np.sign(x) * (np.sqrt(np.abs(x) + 1) - 1) + 1e-3 * x if rescale else x

    def h_inv(x):
        root = (np.sqrt(1 + 4e-3 * (np.abs(x) + 1 + 1e-3)) - 1) / 2e-3
        return np.sign(x) * (root**2 - 1) if rescale else x

    length, sequences = batch.actions.shape
    expected = np.zeros((length, sequences))
    for i in range(length):
        for b in range(sequences):
            row = batch.burn_in + i + int(batch.steps[i, b])
            best = online[row, b].argmax()
            bootstrap = float(batch.discounts[i, b]) * h_inv(target[row, b, best])
            expected[i, b] = h(float(batch.returns[i, b]) + bootstrap)
    np.testing.assert_allclose(r2d2.targets(batch).numpy(), expected, rtol=1e-4, atol=1e-4)

    # the update: the Huber loss of the trained steps, per sequence, weighted; priorities from its TD errors
    q = online[batch.burn_in : batch.burn_in + length]
    q = np.take_along_axis(q, batch.actions.numpy()[..., None], axis=2)[..., 0]
    error = np.abs(q - expected)
    huber = np.where(error < 1.0, 0.5 * error**2, error - 0.5) * batch.trainable.numpy()
    loss = (batch.weights.numpy() * huber.sum(0) / batch.trainable.numpy().sum(0).clip(min=1)).mean()
    before = r2d2.params.clone()
    result = r2d2.train(batch)
    priorities = result.priorities
    assert result.updates == 1 and result.samples == length * sequences
    np.testing.assert_allclose(result.losses["q_loss"], loss, rtol=1e-4, atol=1e-6)
    reference = sequence_priorities(torch.from_numpy(error), batch.trainable, 0.9)
    np.testing.assert_allclose(priorities.numpy(), reference.numpy(), rtol=1e-4, atol=1e-5)
    assert not torch.equal(before, r2d2.params)
    torch.testing.assert_close(r2d2.target_params, r2d2.params)  # --target_update_period 1: copied


def test_the_burn_in_warms_the_state_but_takes_no_gradient(tmp_path):
    """The unroll after a burn-in has the gradient of an unroll started from the burn-in's final state (none flows
    back through the burn-in), and that state matters (a zero state gives other Q-values)."""
    plan = r2d2_plan(tmp_path)
    torch.manual_seed(0)
    r2d2 = R2D2(plan.cfg, plan.spec, torch.device("cpu"), HOOKS)
    batch = sequence_batch(plan.spec, r2d2.model, np.random.default_rng(2))
    model, burn_in = r2d2.model, batch.burn_in
    with torch.no_grad():
        _, states = model.q_sequence(
            {"obs": batch.obs["obs"][:burn_in].reshape(-1, 2)}, batch.initial_state, batch.episode_start[:burn_in]
        )
    warmed = SequenceBatch(
        **{
            **batch.__dict__,
            "obs": {"obs": batch.obs["obs"][burn_in:]},
            "episode_start": batch.episode_start[burn_in:],
            "initial_state": states[-1],
            "burn_in": 0,
        }
    )
    gradients = []
    for each in (batch, warmed):
        model.zero_grad()
        q = r2d2._unroll(model, each)
        q.square().sum().backward()
        gradients.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    torch.testing.assert_close(gradients[0], gradients[1])
    cold = SequenceBatch(**{**warmed.__dict__, "initial_state": torch.zeros_like(states[-1])})
    with torch.no_grad():
        assert not torch.allclose(r2d2._unroll(model, cold)[0], r2d2._unroll(model, batch)[0])
