"""n-step transitions, Q(lambda) returns and (double) DQN targets against plain loop references and
hand-computed cases, on slots with next-step resets, both kinds of episode end and invalid steps."""

import numpy as np
import pytest
import torch

from sf_engine.algo.value_targets import double_q_targets, n_step_transitions, q_lambda_returns

GAMMA = 0.9


def random_slot(seed, num_steps=16, num_traj=24):
    """A slot's step fields: terminated and truncated ends, the invalid reset step after each, steps
    invalid mid-episode (an absent agent, a skipped step), and a slot that may start on a reset step."""
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(num_steps, num_traj)).astype(np.float32)
    terminated, truncated, valid = (np.zeros((num_steps, num_traj), bool) for _ in range(3))
    reset = rng.random(num_traj) < 0.2
    for t in range(num_steps):
        valid[t] = ~reset & (rng.random(num_traj) > 0.08)
        terminated[t] = valid[t] & (rng.random(num_traj) < 0.1)
        truncated[t] = valid[t] & ~terminated[t] & (rng.random(num_traj) < 0.1)
        reset = terminated[t] | truncated[t]
    return rewards, terminated, truncated, valid


def n_step_reference(rewards, terminated, truncated, valid, gamma, n_step):
    num_steps, num_traj = rewards.shape
    returns, discounts = np.zeros((num_steps, num_traj)), np.zeros((num_steps, num_traj))
    steps, trainable = np.zeros((num_steps, num_traj), int), np.zeros((num_steps, num_traj), bool)
    for n in range(num_traj):
        for t in range(num_steps):
            if not valid[t, n]:
                continue
            total, taken, clean, terminal = 0.0, 0, True, False
            for i in range(n_step):
                if t + i == num_steps:  # the slot ends: bootstrap from obs row T
                    break
                if valid[t + i, n]:
                    total += gamma**i * rewards[t + i, n]
                elif i > 0:
                    clean = False
                taken += 1
                if terminated[t + i, n] or truncated[t + i, n]:
                    terminal = bool(terminated[t + i, n])
                    break
            returns[t, n], steps[t, n], trainable[t, n] = total, taken, clean
            discounts[t, n] = 0.0 if terminal else gamma**taken
    return returns, steps, discounts, trainable


@pytest.mark.parametrize("n_step", [1, 3, 40])  # 40: longer than the slot
@pytest.mark.parametrize("seed", [0, 1])
def test_n_step_transitions_match_loop_reference(seed, n_step):
    rewards, terminated, truncated, valid = random_slot(seed)
    result = n_step_transitions(rewards, terminated, truncated, valid, GAMMA, n_step)
    returns, steps, discounts, trainable = n_step_reference(rewards, terminated, truncated, valid, GAMMA, n_step)
    assert result.returns.dtype == np.float32 and result.discounts.dtype == np.float32
    assert result.steps.dtype == np.int64 and result.trainable.dtype == bool
    np.testing.assert_array_equal(result.steps, steps)
    np.testing.assert_array_equal(result.trainable, trainable)
    np.testing.assert_allclose(result.returns, returns, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.discounts, discounts, rtol=1e-6, atol=1e-7)
    if n_step > 1:
        assert (valid & ~trainable).any() and trainable.any()  # the data holds both kinds of window


@pytest.mark.parametrize("n_step", [1, 3, 40])
def test_n_step_windows_stop_at_episode_ends(n_step):
    rewards, terminated, truncated, valid = random_slot(2)
    result = n_step_transitions(rewards, terminated, truncated, valid, GAMMA, n_step)
    dones = terminated | truncated
    seen = {"terminated": 0, "truncated": 0}
    for t, n in zip(*np.nonzero(valid)):
        k = result.steps[t, n]
        assert 1 <= k <= n_step and t + k <= len(rewards)
        assert not dones[t : t + k - 1, n].any()  # no window crosses a reset: a done step can only be its last
        for i in range(k):
            if terminated[t + i, n]:
                assert result.discounts[t, n] == 0.0  # a terminated window bootstraps nothing
                seen["terminated"] += 1
            if truncated[t + i, n]:  # bootstraps from obs row t+i+1, the episode's last observation
                assert k == i + 1 and result.discounts[t, n] == pytest.approx(GAMMA ** (i + 1))
                seen["truncated"] += 1
    assert seen["terminated"] and seen["truncated"]
    assert np.all(result.returns[~valid] == 0) and np.all(result.discounts[~valid] == 0)
    assert not result.trainable[~valid].any()


def test_n_step_transitions_hand_computed():
    # column 0: steps 1 truncated and 4 terminated, each followed by its reset step; column 1: step 2 absent
    rewards = np.array([[1, 1], [2, 1], [0, 1], [4, 1], [8, 1], [0, 1], [16, 1]], np.float32)
    terminated = np.zeros((7, 2), bool)
    truncated = np.zeros((7, 2), bool)
    truncated[1, 0], terminated[4, 0] = True, True
    valid = np.ones((7, 2), bool)
    valid[[2, 5], 0] = False
    valid[2, 1] = False
    result = n_step_transitions(rewards, terminated, truncated, valid, 0.5, 3)
    np.testing.assert_allclose(result.returns[:, 0], [2, 2, 0, 8, 8, 0, 16])
    np.testing.assert_array_equal(result.steps[:, 0], [2, 1, 0, 2, 1, 0, 1])
    np.testing.assert_allclose(result.discounts[:, 0], [0.25, 0.5, 0, 0, 0, 0, 0.5])
    np.testing.assert_array_equal(result.trainable[:, 0], valid[:, 0])
    np.testing.assert_allclose(result.returns[:, 1], [1.5, 1.25, 0, 1.75, 1.75, 1.5, 1])
    np.testing.assert_array_equal(result.steps[:, 1], [3, 3, 0, 3, 3, 2, 1])
    np.testing.assert_allclose(result.discounts[:, 1], [0.125, 0.125, 0, 0.125, 0.125, 0.25, 0.5])
    np.testing.assert_array_equal(result.trainable[:, 1], [False, False, False, True, True, True, True])


def q_lambda_reference(rewards, next_max_q, terminated, dones, valid, gamma, lam):
    num_steps, num_traj = rewards.shape
    targets = np.zeros((num_steps, num_traj))
    for n in range(num_traj):
        for t in reversed(range(num_steps)):
            if not valid[t, n]:
                continue
            one_step = rewards[t, n] + (0.0 if terminated[t, n] else gamma * next_max_q[t, n])
            if dones[t, n] or t == num_steps - 1 or not valid[t + 1, n]:
                targets[t, n] = one_step
            else:
                mixed = (1 - lam) * next_max_q[t, n] + lam * targets[t + 1, n]
                targets[t, n] = rewards[t, n] + gamma * mixed
    return targets


def q_lambda_inputs(seed):
    rewards, terminated, truncated, valid = random_slot(seed)
    next_max_q = np.random.default_rng(seed + 100).normal(size=rewards.shape).astype(np.float32)
    return rewards, next_max_q, terminated, terminated | truncated, valid


@pytest.mark.parametrize("lam", [0.0, 0.65, 1.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_q_lambda_returns_match_loop_reference(seed, lam):
    inputs = q_lambda_inputs(seed)
    targets = q_lambda_returns(*map(torch.from_numpy, inputs), GAMMA, lam)
    np.testing.assert_allclose(targets.numpy(), q_lambda_reference(*inputs, GAMMA, lam), rtol=1e-5, atol=1e-5)
    assert np.all(targets.numpy()[~inputs[-1]] == 0)


def test_q_lambda_zero_is_one_step_q_learning():
    rewards, next_max_q, terminated, dones, valid = q_lambda_inputs(3)
    targets = q_lambda_returns(*map(torch.from_numpy, (rewards, next_max_q, terminated, dones, valid)), GAMMA, 0.0)
    expected = (rewards + GAMMA * next_max_q * ~terminated) * valid
    np.testing.assert_allclose(targets.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_q_lambda_one_is_the_longest_n_step_return():
    """lambda = 1: the discounted rewards to the episode's or the slot's end, bootstrapped from there."""
    rewards, next_max_q, terminated, dones, valid = q_lambda_inputs(4)
    truncated = dones & ~terminated
    targets = q_lambda_returns(*map(torch.from_numpy, (rewards, next_max_q, terminated, dones, valid)), GAMMA, 1.0)
    windows = n_step_transitions(rewards, terminated, truncated, valid, GAMMA, len(rewards))
    starts, columns = np.nonzero(windows.trainable)
    last = starts + windows.steps[starts, columns] - 1  # next_max_q[t] is the value of obs row t+1
    expected = windows.returns[starts, columns] + windows.discounts[starts, columns] * next_max_q[last, columns]
    np.testing.assert_allclose(targets.numpy()[starts, columns], expected, rtol=1e-5, atol=1e-5)


def test_q_lambda_truncation_bootstraps_and_termination_does_not():
    # one trajectory: step 1 truncated, step 2 its reset step, step 4 terminated, step 5 the reset step
    rewards = torch.tensor([[1.0], [2.0], [0.0], [3.0], [4.0], [0.0], [5.0]])
    next_max_q = torch.tensor([[10.0], [20.0], [30.0], [40.0], [50.0], [60.0], [70.0]])
    terminated = torch.tensor([[False], [False], [False], [False], [True], [False], [False]])
    truncated = torch.tensor([[False], [True], [False], [False], [False], [False], [False]])
    valid = torch.tensor([[True], [True], [False], [True], [True], [False], [True]])
    gamma, lam = 0.5, 0.5
    targets = q_lambda_returns(rewards, next_max_q, terminated, terminated | truncated, valid, gamma, lam)[:, 0]
    assert targets[1].item() == pytest.approx(2.0 + 0.5 * 20.0)  # from the truncated episode's last obs
    assert targets[0].item() == pytest.approx(1.0 + 0.5 * (0.5 * 10.0 + 0.5 * targets[1].item()))
    assert targets[4].item() == pytest.approx(4.0)  # nothing after termination
    assert targets[3].item() == pytest.approx(3.0 + 0.5 * (0.5 * 40.0 + 0.5 * 4.0))
    assert targets[6].item() == pytest.approx(5.0 + 0.5 * 70.0)  # the slot's last row: the bootstrap row
    assert targets[2].item() == 0.0 and targets[5].item() == 0.0


def test_q_lambda_stops_before_an_invalid_step():
    """An invalid step's target is 0: the step before it bootstraps fully from the max Q, not from that 0."""
    rewards, next_max_q = torch.ones(3, 1), torch.full((3, 1), 10.0)
    no_end, valid = torch.zeros(3, 1, dtype=torch.bool), torch.tensor([[True], [False], [True]])
    targets = q_lambda_returns(rewards, next_max_q, no_end, no_end, valid, 0.5, 0.8)[:, 0]
    assert targets.tolist() == pytest.approx([1.0 + 0.5 * 10.0, 0.0, 1.0 + 0.5 * 10.0])


def double_q_reference(returns, discounts, online, target, legal, double):
    out = []
    for b in range(len(returns)):
        actions = [a for a in range(online.shape[1]) if legal is None or legal[b, a]]
        actions = actions or list(range(online.shape[1]))
        if double:
            value = target[b, max(actions, key=lambda a: online[b, a])]
        else:
            value = max(target[b, a] for a in actions)
        out.append(returns[b] + discounts[b] * value)
    return np.array(out)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("double", [True, False])
def test_double_q_targets_match_reference(double, masked):
    rng = np.random.default_rng(5)
    returns, discounts = rng.normal(size=32).astype(np.float32), rng.random(32).astype(np.float32)
    online, target = (rng.normal(size=(32, 6)).astype(np.float32) for _ in range(2))
    legal = rng.random((32, 6)) < 0.5 if masked else None
    if masked:
        legal[0] = False  # a row with no legal action: every action counts
    tensors = [torch.from_numpy(x) for x in (returns, discounts, online, target)]
    result = double_q_targets(*tensors, None if legal is None else torch.from_numpy(legal), double=double)
    expected = double_q_reference(returns, discounts, online, target, legal, double)
    np.testing.assert_allclose(result.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_double_q_never_picks_an_illegal_action():
    returns, discounts = torch.tensor([1.0, 1.0]), torch.tensor([0.5, 0.5])
    online = torch.tensor([[9.0, 2.0, 1.0], [0.0, 5.0, 7.0]])  # the online favourite is illegal in both rows
    target = torch.tensor([[100.0, 4.0, 8.0], [3.0, 6.0, 200.0]])
    legal = torch.tensor([[False, True, True], [True, True, False]])
    double = double_q_targets(returns, discounts, online, target, legal)
    assert double.tolist() == pytest.approx([1.0 + 0.5 * 4.0, 1.0 + 0.5 * 6.0])  # legal argmax: actions 1, 1
    plain = double_q_targets(returns, discounts, online, target, legal, double=False)
    assert plain.tolist() == pytest.approx([1.0 + 0.5 * 8.0, 1.0 + 0.5 * 6.0])  # the target's legal max
    unmasked = double_q_targets(returns, discounts, online, target)
    assert unmasked.tolist() == pytest.approx([1.0 + 0.5 * 100.0, 1.0 + 0.5 * 200.0])


def test_double_q_targets_carry_no_gradient():
    online = torch.randn(4, 3, requires_grad=True)
    result = double_q_targets(torch.zeros(4), torch.ones(4), online, online * 2)
    assert not result.requires_grad
