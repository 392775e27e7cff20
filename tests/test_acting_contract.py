"""The acting contract (sf_engine.model.acting): every algorithm's acting network acts through one `act(obs, state,
ctx)`, its exploration included, and every acting site calls only it: the policy worker and the device sampler give
the same actions as the network's own act for the same context and seed, enjoy.py's loop and load_policy the same
greedy ones; a user's acting network that breaks the contract is one line before anything starts."""

import os

import numpy as np
import pytest
import torch
from conftest import SerialRun, serial_plan, train_error

import sf_engine
from sf_engine.algo.acting import build_policy
from sf_engine.config import algorithms
from sf_engine.model.acting import GREEDY, PLAYING, ActContext, contract_breaches
from sf_engine.model.actor_critic import obs_tensors
from sf_engine.play.episodes import act

ALGORITHMS = [
    ("ppo", "CartPole-v1", ()),
    ("ppo", "CartPoleNoVel-v1", ("--rnn", "gru")),
    ("dqn", "CartPole-v1", ()),
    ("pqn", "CartPole-v1", ()),
    ("r2d2", "CartPoleNoVel-v1", ("--rollout", "32")),
    ("sac", "Pendulum-v1", ()),
    ("td3", "Pendulum-v1", ()),
    ("qrdqn", "CartPole-v1", ()),
    ("crossq", "Pendulum-v1", ("--compile", "false")),  # acting never runs the compiled critic loss
]


def _recorded(run: SerialRun) -> tuple:
    """The observations a rollout worker's envs gave, as the policy worker reads them, and the carried states."""
    slots = run.full_slots(1)
    obs = {key: torch.from_numpy(array[slots[0], 0]) for key, array in run.buffers.obs.items()}
    model = run.policy.models[0]
    return obs, model.initial_state(len(next(iter(obs.values()))))


@pytest.mark.parametrize("algo, env, flags", ALGORITHMS)
def test_every_site_acts_as_the_networks_act_does(tmp_path, shm_dir, algo, env, flags):
    plan = serial_plan(tmp_path, shm_dir, env, "--algo", algo, *flags)
    run = SerialRun(plan, tmp_path)
    try:
        obs, state = _recorded(run)
        model = run.policy.models[0]
        assert contract_breaches(model) == []
        rows = run.policy._rows(np.array([1]))
        ctx = run.policy._context(0, rows)
        assert ctx.training and ctx.num_rows == plan.cfg.sampler.total_splits * plan.cfg.sampler.envs_per_split
        torch.manual_seed(5)
        worker = run.policy._forward(obs, state, None, rows)
        torch.manual_seed(5)
        with torch.inference_mode():  # as every acting site runs it
            direct = model.act(obs, state, ctx)
        for got, expected in zip(worker, direct):
            assert (got is None) == (expected is None)
            if expected is not None:
                np.testing.assert_array_equal(got, expected.numpy())
        again = build_policy(plan.spec, plan.cfg)  # as load_policy and export build it, with the same weights
        again.load_state_dict(model.state_dict())
        with torch.inference_mode():
            greedy = model.act(obs, state, GREEDY)
            played, _ = act(model, obs, state, deterministic=True)  # the evaluator's and enjoy.py's loop
            assert torch.equal(played, greedy.actions)
            assert torch.equal(again.act(obs, state, GREEDY).actions, greedy.actions)
    finally:
        run.close()


def test_load_policy_acts_greedily_through_act(tmp_path, shm_dir):
    result = sf_engine.train(
        algo="dqn", mode="serial", train_dir=str(tmp_path), shm_dir=shm_dir, train_for_env_steps=2000, learning_starts=0
    )
    policy = sf_engine.load_policy(result.experiment_dir)
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    expected = policy.model.act(obs_tensors({"obs": obs}), None, GREEDY).actions.numpy()
    np.testing.assert_array_equal(policy.act(obs), expected)


def test_the_device_sampler_acts_through_act(tmp_path, shm_dir):
    from test_device_mode import one_rollout

    plan, buffers, sampler, slot, _, roles = one_rollout(tmp_path, shm_dir, "TorchCartPole-v1")
    try:
        ctx = sampler._context()
        assert ctx.training and torch.equal(ctx.rows, torch.arange(4)) and ctx.num_rows == 4
        torch.manual_seed(3)
        actions, log_probs, values = sampler._act(ctx, None)
        torch.manual_seed(3)
        direct = sampler.model.act({sampler.key: sampler.acting_obs}, None, ctx)
        assert torch.equal(actions, direct.actions) and torch.equal(values, direct.values)
    finally:
        buffers.release()


def test_exploration_is_the_networks_own(tmp_path, shm_dir):
    """DQN explores by its epsilon schedule and Ape-X's rows only when acting for training; SAC acts uniformly
    before the learner's first update only when acting for training, and samples its actor once learning started."""
    plan = serial_plan(tmp_path, shm_dir, "CartPole-v1", "--algo", "dqn")
    dqn = build_policy(plan.spec, plan.cfg)
    obs = {"obs": torch.randn(512, 4)}
    greedy = dqn.act(obs, None, GREEDY).actions
    assert torch.equal(dqn.act(obs, None, PLAYING).actions, greedy)  # a Q-network's own policy is its argmax
    early = ActContext(training=True, env_steps=0, rows=np.arange(512), num_rows=512)  # epsilon_start 0.4 ** ...
    explored = (dqn.act(obs, None, early).actions != greedy).float()
    assert explored[:64].mean() > 0.1 and explored[-64:].mean() < 0.02  # row 0's epsilon 0.4, the last's 0.4 ** 8

    plan = serial_plan(tmp_path, shm_dir, "Pendulum-v1", "--algo", "sac")
    sac = build_policy(plan.spec, plan.cfg)
    obs = {"obs": torch.zeros(256, 3)}
    torch.manual_seed(0)
    uniform = (torch.rand(256, 1) * 2 - 1) * 2.0  # within Pendulum's bounds [-2, 2]
    for ctx, acts_uniformly in [
        (ActContext(training=True, version=0), True),
        (ActContext(training=True, version=1), False),
        (PLAYING, False),
    ]:
        torch.manual_seed(0)
        assert torch.allclose(sac.act(obs, None, ctx).actions, uniform) == acts_uniformly, ctx


BROKEN = """
import torch
import sf_engine
from sf_engine.algo.base import TrainResult


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def forward(self, obs):
        return self.layer(obs["obs"])


class Broken:
    @staticmethod
    def acting_network(spec, cfg, bf16=False):
        return Net()

    def __init__(self, cfg, spec, device, hooks):
        self.model = Net()

    def train(self, batch):
        return TrainResult(0)


SPEC = sf_engine.AlgorithmSpec(learner="broken_net:Broken", description="a plain module as its acting network")
"""


def test_a_users_acting_network_that_breaks_the_contract_is_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "broken_net.py").write_text(BROKEN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(algorithms, "_FROM_MODULES", {})
    line = train_error(["--algo", "broken_net:SPEC"], tmp_path / "runs", capsys)
    assert line.startswith("error: --algo broken_net:SPEC: its acting network (Net) lacks recurrent, state_size,")
    assert "act of the acting contract" in line and "sf_engine.ActingNetwork" in line
    assert not os.path.exists(tmp_path / "runs")  # refused before anything on disk
