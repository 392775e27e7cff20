"""How a Q-network acts (--algo dqn, --algo pqn): Ape-X's epsilon per env row and its schedule, epsilon-greedy
sampling (greedy, uniform over the legal actions, the log-probabilities of the mixture), and action masks that
no greedy or exploring choice ever crosses, even where an illegal action has the highest Q-value."""

import numpy as np
import pytest
import torch
from conftest import SerialRun, serial_plan

from sf_engine.config.groups import ModelConfig
from sf_engine.config.value import QConfig
from sf_engine.envs import ActionSpec, EnvSpec, probe_env_spec
from sf_engine.model.q_network import QNetwork, base_epsilon, epsilon_exponents, row_epsilons
from sf_engine.model.shape import resolve_model_config

ROWS = 40_000


def q_network(spec, **q_flags) -> QNetwork:
    torch.manual_seed(0)
    return QNetwork(spec, resolve_model_config(ModelConfig(hidden_size=16), spec), QConfig(**q_flags))


def four_actions() -> tuple:
    """A 4-action Q-network without a mask and ROWS observations."""
    spec = EnvSpec((("obs", (3,), "float32"),), ActionSpec("discrete", nvec=(4,)))
    torch.manual_seed(1)
    return q_network(spec), {"obs": torch.randn(ROWS, 3)}


def masked_choice(illegal_action: int = 2) -> tuple:
    """MaskedChoiceEnv's Q-network with `illegal_action` the highest raw Q-value of every row and illegal in
    every row, and ROWS observations whose masks leave 1 to 4 legal actions (a row's own random set)."""
    spec = probe_env_spec("toy_envs:MaskedChoiceEnv", "auto")
    assert spec.action_mask
    model = q_network(spec)
    with torch.no_grad():
        model.q_head.bias[illegal_action] = 1e6
    rng = np.random.default_rng(2)
    mask = (rng.random((ROWS, 5)) < 0.5).astype(np.float32)
    mask[np.arange(ROWS), rng.choice([0, 1, 3, 4], ROWS)] = 1.0  # at least one legal action per row
    mask[:, illegal_action] = 0.0
    obs = {"obs": torch.from_numpy(rng.random((ROWS, 5), dtype=np.float32)), "action_mask": torch.from_numpy(mask)}
    with torch.no_grad():
        assert (model.q_values(obs).argmax(dim=1) == illegal_action).all()  # unmasked, it would win everywhere
    return model, obs, torch.from_numpy(mask).bool()


def test_ape_x_exponents_go_from_one_to_one_plus_alpha():
    exponents = epsilon_exponents(8, 7.0)
    np.testing.assert_allclose(exponents, 1.0 + 7.0 * np.arange(8) / 7)
    assert exponents[0] == 1.0 and exponents[-1] == 8.0
    np.testing.assert_allclose(epsilon_exponents(5, 7.0), [1.0, 2.75, 4.5, 6.25, 8.0])
    np.testing.assert_array_equal(epsilon_exponents(1, 7.0), [1.0])  # one row: the base epsilon
    np.testing.assert_array_equal(epsilon_exponents(6, 0.0), np.ones(6))


def test_base_epsilon_decays_linearly_then_stays_at_the_end():
    qcfg = QConfig(epsilon_start=1.0, epsilon_end=0.1, epsilon_decay_env_steps=1000)
    figures = [base_epsilon(qcfg, steps) for steps in (0, 250, 500, 1000, 1001, 10**9)]
    np.testing.assert_allclose(figures, [1.0, 0.775, 0.55, 0.1, 0.1, 0.1])
    assert base_epsilon(QConfig(epsilon_start=0.4, epsilon_end=0.4), 12345) == pytest.approx(0.4)
    quick = QConfig(epsilon_start=1.0, epsilon_end=0.05, epsilon_decay_env_steps=1)
    assert base_epsilon(quick, 0) == 1.0 and base_epsilon(quick, 1) == pytest.approx(0.05)


def test_the_policy_worker_gives_each_env_row_its_ape_x_epsilon(tmp_path, shm_dir):
    """2 workers x 2 splits x 2 envs: env row i = (worker, split, env) of 8 acts with base ** (1 + 7 i / 7),
    the base after the run's env steps so far."""
    plan = serial_plan(
        tmp_path,
        shm_dir,
        "CartPole-v1",
        "--algo",
        "dqn",
        "--num_workers",
        "2",
        "--num_envs_per_worker",
        "4",
        "--worker_num_splits",
        "2",
        "--epsilon_start",
        "0.5",
        "--epsilon_end",
        "0.1",
        "--epsilon_decay_env_steps",
        "1000",
    )
    run = SerialRun(plan, tmp_path)
    try:
        run.buffers.env_steps[:2] = [300, 200]  # 500 env steps: the base is 0.3
        ctx = run.policy._context(0, run.policy._rows(np.array([3, 0, 2])))  # global split indices
        qcfg = plan.cfg.q  # what the Q-network's act makes of what the worker knows
        epsilons = row_epsilons(base_epsilon(qcfg, ctx.env_steps), ctx, qcfg.apex_alpha, 6, "cpu").numpy()
    finally:
        run.close()
    every_row = 0.3 ** (1.0 + np.arange(8))
    np.testing.assert_allclose(epsilons, every_row[[6, 7, 0, 1, 4, 5]], rtol=1e-6)


def test_epsilon_zero_is_greedy_and_epsilon_one_uniform_per_row():
    """Rows alternate epsilon 0 and 1 in one batch: the first all greedy, the second each action about a
    quarter of the time (greedy included)."""
    model, obs = four_actions()
    epsilons = torch.tensor([0.0, 1.0]).repeat(ROWS // 2)
    torch.manual_seed(3)
    with torch.no_grad():
        actions, log_probs, values, state = model.sample(obs, epsilons=epsilons)
        q = model.q_values(obs)
    greedy = q.argmax(dim=1)
    assert state is None and actions.dtype == torch.int64
    torch.testing.assert_close(values, q.max(dim=1).values)
    assert (actions[0::2] == greedy[0::2]).all()
    assert len(greedy.unique()) > 1  # the greedy action differs between rows
    frequencies = torch.bincount(actions[1::2], minlength=4).float() / (ROWS // 2)
    torch.testing.assert_close(frequencies, torch.full((4,), 0.25), atol=0.02, rtol=0)
    torch.testing.assert_close(log_probs[0::2], torch.zeros(ROWS // 2))
    torch.testing.assert_close(log_probs[1::2], torch.full((ROWS // 2,), float(np.log(0.25))))
    with torch.no_grad():
        plain, _, _, _ = model.sample(obs)
    assert (plain == greedy).all()  # no epsilons: greedy everywhere


def test_log_probabilities_are_those_of_the_epsilon_greedy_mixture():
    """log(eps / legal actions + (1 - eps) [a == greedy]), with a mask and with half the rows exploring: the
    greedy action is taken about eps / legal + 1 - eps of the time."""
    model, obs, legal = masked_choice()
    torch.manual_seed(4)
    epsilons = torch.rand(ROWS)
    with torch.no_grad():
        actions, log_probs, _, _ = model.sample(obs, epsilons=epsilons)
        greedy = model(obs)[0].argmax(dim=1)
    num_legal = legal.sum(dim=1).float()
    expected = torch.log(epsilons / num_legal + (1.0 - epsilons) * (actions == greedy).float())
    torch.testing.assert_close(log_probs, expected, rtol=1e-5, atol=1e-5)
    half = torch.full((ROWS,), 0.5)
    with torch.no_grad():
        actions, _, _, _ = model.sample(obs, epsilons=half)
    took_greedy = (actions == greedy).float().mean()
    assert took_greedy == pytest.approx(float((0.5 / num_legal + 0.5).mean()), abs=0.01)


@pytest.mark.parametrize("epsilon", [0.0, 0.3, 1.0])
def test_no_illegal_action_even_with_the_highest_q_value(epsilon):
    """Greedy, exploring and mixed rows all keep to the mask; the value is the legal maximum; exploring rows
    choose uniformly among their legal actions."""
    model, obs, legal = masked_choice(illegal_action=2)
    torch.manual_seed(5)
    with torch.no_grad():
        actions, log_probs, values, _ = model.sample(obs, epsilons=torch.full((ROWS,), epsilon))
        greedy = model.distribution.mode(model(obs)[0])
        raw = model.q_values(obs)
    assert legal[torch.arange(ROWS), actions].all() and legal[torch.arange(ROWS), greedy].all()
    assert torch.isfinite(log_probs).all()
    torch.testing.assert_close(values, raw.masked_fill(~legal, -torch.inf).max(dim=1).values)  # the legal maximum
    if epsilon == 1.0:  # uniform over each row's legal actions: a row with k legal takes each 1/k of the time
        rows = legal.sum(dim=1) == 2
        first_legal = legal.float().argmax(dim=1)  # the lower of the two
        assert float((actions[rows] == first_legal[rows]).float().mean()) == pytest.approx(0.5, abs=0.02)


def test_a_row_without_any_legal_action_acts_on_every_action():
    model, obs, _ = masked_choice()
    rows = {key: value[:8].clone() for key, value in obs.items()}
    rows["action_mask"][:] = 0.0
    with torch.no_grad():
        actions, log_probs, _, _ = model.sample(rows, epsilons=torch.ones(8))
        greedy = model(rows)[0].argmax(dim=1)
    assert (greedy == 2).all()  # the raw argmax: no action is masked
    assert torch.isfinite(log_probs).all()
    torch.testing.assert_close(log_probs, torch.full((8,), float(np.log(0.2))))
    assert ((actions >= 0) & (actions < 5)).all()
