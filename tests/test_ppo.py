"""GAE, V-trace and PPO loss pieces against plain numpy references and hand-computed cases."""

import numpy as np
import pytest
import torch

from sf_engine.algo import targets
from sf_engine.algo.ppo import loss as ppo_loss
from sf_engine.envs import ActionSpec
from sf_engine.model import kernels
from sf_engine.model.distributions import ActionDistribution


def random_rollout(seed, num_steps=17, num_traj=9):
    """Random rewards/values with terminations, truncations and the invalid reset step after each end."""
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(num_steps, num_traj)).astype(np.float32)
    values = rng.normal(size=(num_steps + 1, num_traj)).astype(np.float32)
    terminated = rng.random((num_steps, num_traj)) < 0.1
    truncated = (rng.random((num_steps, num_traj)) < 0.1) & ~terminated
    dones = terminated | truncated
    valid = np.ones((num_steps, num_traj), bool)
    valid[1:] = ~dones[:-1]
    valid[0] = rng.random(num_traj) < 0.8  # the slot may start on a reset step
    terminated &= valid
    truncated &= valid
    return rewards, values, terminated, truncated, terminated | truncated, valid


def gae_reference(rewards, values, terminated, dones, valid, gamma, lam):
    num_steps, num_traj = rewards.shape
    adv = np.zeros_like(rewards)
    for n in range(num_traj):
        for t in range(num_steps):
            if not valid[t, n]:
                continue
            # sum of discounted TD errors until the episode or the rollout ends
            total, factor = 0.0, 1.0
            for k in range(t, num_steps):
                bootstrap = 0.0 if terminated[k, n] else values[k + 1, n]
                total += factor * (rewards[k, n] + gamma * bootstrap - values[k, n])
                if dones[k, n]:
                    break
                factor *= gamma * lam
            adv[t, n] = total
    return adv


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_numpy_reference(seed):
    rewards, values, terminated, truncated, dones, valid = random_rollout(seed)
    adv, returns = targets.gae(*map(torch.from_numpy, (rewards, values, terminated, dones, valid)), 0.97, 0.9)
    expected = gae_reference(rewards, values, terminated, dones, valid, 0.97, 0.9)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(returns.numpy(), (expected + values[:-1]) * valid, rtol=1e-5, atol=1e-5)
    assert np.all(adv.numpy()[~valid] == 0)


def test_gae_truncation_bootstraps_and_termination_does_not():
    # one trajectory: step 0 truncated, step 1 is the reset step, step 2 terminated
    rewards = torch.tensor([[1.0], [0.0], [2.0]])
    values = torch.tensor([[0.5], [10.0], [0.3], [7.0]])
    terminated = torch.tensor([[False], [False], [True]])
    truncated = torch.tensor([[True], [False], [False]])
    valid = torch.tensor([[True], [False], [True]])
    adv, _ = targets.gae(rewards, values, terminated, terminated | truncated, valid, 0.9, 0.8)
    assert adv[0, 0].item() == pytest.approx(1.0 + 0.9 * 10.0 - 0.5)  # bootstraps from the final obs
    assert adv[1, 0].item() == 0.0
    assert adv[2, 0].item() == pytest.approx(2.0 - 0.3)  # no bootstrap after termination


def vtrace_reference(behavior, target, rewards, values, terminated, dones, valid, gamma, rho_bar, c_bar):
    num_steps, num_traj = rewards.shape
    rho = np.exp(target - behavior)
    vs = np.zeros_like(rewards)
    adv = np.zeros_like(rewards)
    for n in range(num_traj):
        for s in range(num_steps):
            if not valid[s, n]:
                continue
            total, trace = 0.0, 1.0
            for t in range(s, num_steps):
                bootstrap = 0.0 if terminated[t, n] else values[t + 1, n]
                delta = min(rho_bar, rho[t, n]) * (rewards[t, n] + gamma * bootstrap - values[t, n])
                total += trace * delta
                if dones[t, n]:
                    break
                trace *= gamma * min(c_bar, rho[t, n])
            vs[s, n] = values[s, n] + total
        for s in range(num_steps):
            if not valid[s, n]:
                continue
            next_vs = values[s + 1, n] if (dones[s, n] or s == num_steps - 1) else vs[s + 1, n]
            bootstrap = 0.0 if terminated[s, n] else next_vs
            adv[s, n] = min(rho_bar, rho[s, n]) * (rewards[s, n] + gamma * bootstrap - values[s, n])
    return vs, adv


@pytest.mark.parametrize("seed", [0, 1])
def test_vtrace_matches_numpy_reference(seed):
    rewards, values, terminated, truncated, dones, valid = random_rollout(seed)
    rng = np.random.default_rng(seed + 100)
    behavior = rng.normal(-0.7, 0.3, size=rewards.shape).astype(np.float32)
    target = behavior + rng.normal(0, 0.5, size=rewards.shape).astype(np.float32)
    vs, adv = targets.vtrace(
        *map(torch.from_numpy, (behavior, target, rewards, values, terminated, dones, valid)),
        gamma=0.95,
        rho_bar=1.0,
        c_bar=0.9,
    )
    ref_vs, ref_adv = vtrace_reference(behavior, target, rewards, values, terminated, dones, valid, 0.95, 1.0, 0.9)
    np.testing.assert_allclose(vs.numpy(), ref_vs * valid, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-4, atol=1e-4)


def test_vtrace_on_policy_equals_gae_with_lambda_one():
    rewards, values, terminated, truncated, dones, valid = map(torch.from_numpy, random_rollout(5))
    log_probs = torch.full(rewards.shape, -0.5)
    vs, _ = targets.vtrace(log_probs, log_probs, rewards, values, terminated, dones, valid, 0.9, 1.0, 1.0)
    _, returns = targets.gae(rewards, values, terminated, dones, valid, 0.9, 1.0)
    torch.testing.assert_close(vs, returns)


def test_ppo_losses_hand_computed():
    old = torch.log(torch.tensor([0.5, 0.5]))
    new = torch.log(torch.tensor([0.75, 0.25]))  # ratios 1.5 and 0.5
    adv = torch.tensor([1.0, -2.0])
    policy_loss, value_loss, entropy, approx_kl, clip_fraction = ppo_loss.ppo_losses(
        new, old, adv, torch.tensor([1.0, 2.0]), torch.tensor([0.0, 4.0]), torch.tensor([0.3, 0.5]), 0.2
    )
    # min(1.5*1, 1.2*1) = 1.2 ; min(0.5*-2, 0.8*-2) = -1.6  -> -(1.2 - 1.6) / 2
    assert policy_loss.item() == pytest.approx(0.2)
    assert value_loss.item() == pytest.approx(0.5 * (1.0 + 4.0) / 2)
    assert entropy.item() == pytest.approx(0.4)
    assert clip_fraction.item() == pytest.approx(1.0)
    expected_kl = ((1.5 - 1 - np.log(1.5)) + (0.5 - 1 - np.log(0.5))) / 2
    assert approx_kl.item() == pytest.approx(expected_kl, rel=1e-5)


@pytest.mark.parametrize("entropy_coeff", [0.0, 0.01])
@pytest.mark.parametrize("compiled", [True, False])
def test_fused_discrete_loss_matches_autograd_through_ppo_losses(entropy_coeff, compiled):
    """The hand-written loss node (the compiled kernel, and the torch ops that run without it) against
    autograd through log_softmax and ppo_losses: the loss, the stats and the gradients, with ratios
    inside and outside the clip range, ties (ratio 1) and zero advantages."""
    if compiled and kernels.KERNELS is None:
        pytest.skip("the compiled CPU kernels are not built")
    torch.manual_seed(0)
    logits = (torch.randn(512, 5) * 2).requires_grad_()
    values = torch.randn(512).requires_grad_()
    actions = torch.randint(0, 5, (512,))
    log_pi = torch.log_softmax(logits.detach(), -1).gather(1, actions.unsqueeze(1)).squeeze(1)
    old = log_pi + torch.randn(512) * 0.5
    old[:64] = log_pi[:64]  # ratio exactly 1
    advantages, returns = torch.randn(512), torch.randn(512)
    advantages[64:96] = 0.0
    loss, stats = ppo_loss.DiscretePPOLoss.apply(
        logits, values, actions, old, advantages, returns, ppo_loss.LossCoefficients(0.2, 0.5, entropy_coeff), compiled
    )
    fused_grads = torch.autograd.grad(loss, [logits, values])
    reference_log_pi = torch.log_softmax(logits, -1)
    entropy = -(reference_log_pi.exp() * reference_log_pi).sum(-1)
    pieces = ppo_loss.ppo_losses(
        reference_log_pi.gather(1, actions.unsqueeze(1)).squeeze(1), old, advantages, values, returns, entropy, 0.2
    )
    reference = pieces[0] + 0.5 * pieces[1] - entropy_coeff * pieces[2]
    reference_grads = torch.autograd.grad(reference, [logits, values])
    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(stats, torch.stack([x.detach() for x in pieces]))
    assert 0.1 < float(stats[4]) < 0.9  # some samples clipped, some not
    for fused, expected in zip(fused_grads, reference_grads):
        torch.testing.assert_close(fused, expected)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch-ops"])
def test_categorical_log_prob_entropy_and_sampling(compiled, monkeypatch):
    """Acting's samples follow the softmax distribution with the log-probs of the learner's log_prob_entropy, from
    the compiled inverse-CDF pass (on the CPU where built) and from torch's Gumbel-max alike; a masked action (its
    logit MASKED_LOGIT) is never taken."""
    from sf_engine.model import kernels
    from sf_engine.model.actor_critic import MASKED_LOGIT

    if compiled and kernels.KERNELS is None:
        pytest.skip("the compiled CPU kernels are not built")
    if not compiled:
        monkeypatch.setattr(kernels, "KERNELS", None)
    torch.manual_seed(0)
    dist = ActionDistribution(ActionSpec("discrete", nvec=(5,)))
    logits = torch.randn(64, 5)
    actions = torch.randint(0, 5, (64,))
    log_probs, entropy = dist.log_prob_entropy(logits, actions)
    reference = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(log_probs, reference.log_prob(actions))
    torch.testing.assert_close(entropy, reference.entropy())
    logits = torch.tensor([[0.0, 1.0, 2.0, MASKED_LOGIT], [MASKED_LOGIT, 3.0, 0.0, -1.0]]).repeat(100_000, 1)
    sampled, sampled_log_probs = ActionDistribution(ActionSpec("discrete", nvec=(4,))).sample(logits)
    assert sampled.dtype == torch.int64 and sampled.shape == (200_000,)
    for row in range(2):
        freq = torch.bincount(sampled[row::2], minlength=4).float() / 100_000
        torch.testing.assert_close(freq, torch.softmax(logits[row], -1), atol=5e-3, rtol=0)
        assert freq[3 * (1 - row)] == 0, "a masked action was taken"
    torch.testing.assert_close(sampled_log_probs, torch.log_softmax(logits, -1).gather(1, sampled[:, None])[:, 0])


def test_compiled_categorical_sampling_takes_no_action_of_probability_zero():
    """The inverse CDF with u as close to 1 as float32 has (u * total rounds up to total): the last action that can be
    taken, not one whose probability is 0."""
    from sf_engine.model import kernels
    from sf_engine.model.actor_critic import MASKED_LOGIT

    if kernels.KERNELS is None:
        pytest.skip("the compiled CPU kernels are not built")
    logits = torch.tensor([[0.0, 0.3, MASKED_LOGIT], [MASKED_LOGIT, 1.0, MASKED_LOGIT], [2.0, -5.0, 1.0]])
    top = torch.full((3,), 1.0 - 2.0**-24)
    actions, log_probs = kernels.KERNELS.categorical_sample(logits, top)
    assert actions.tolist() == [1, 1, 2]
    actions, _ = kernels.KERNELS.categorical_sample(logits, torch.zeros(3))
    assert actions.tolist() == [0, 1, 0]
    torch.testing.assert_close(log_probs, torch.log_softmax(logits, -1)[torch.arange(3), torch.tensor([1, 1, 2])])


def test_multi_discrete_is_a_product_of_categoricals():
    torch.manual_seed(1)
    dist = ActionDistribution(ActionSpec("multi_discrete", nvec=(3, 2, 4)))
    logits = torch.randn(32, 9)
    actions, log_probs = dist.sample(logits)
    assert actions.shape == (32, 3) and (actions < torch.tensor([3, 2, 4])).all()
    parts = [torch.distributions.Categorical(logits=chunk) for chunk in logits.split([3, 2, 4], dim=-1)]
    expected = sum(p.log_prob(actions[:, i]) for i, p in enumerate(parts))
    torch.testing.assert_close(log_probs, expected)
    torch.testing.assert_close(dist.log_prob_entropy(logits, actions)[1], sum(p.entropy() for p in parts))


def test_gaussian_log_prob_and_entropy_match_torch_distributions():
    torch.manual_seed(2)
    dist = ActionDistribution(ActionSpec("continuous", shape=(6,), low=(-1.0,) * 6, high=(1.0,) * 6))
    means, log_std = torch.randn(128, 6), torch.randn(6) * 0.5
    actions, log_probs = dist.sample(means, log_std)
    reference = torch.distributions.Normal(means, log_std.exp())
    torch.testing.assert_close(log_probs, reference.log_prob(actions).sum(-1))
    torch.testing.assert_close(dist.log_prob_entropy(means, actions, log_std)[1], reference.entropy().sum(-1))
    assert (actions.abs() > 1).any()  # the trained-on sample is not clipped (the env gets it clipped)


def test_backward_recursion_numpy_and_torch_ways_agree():
    """GAE's and V-trace's recursion runs in NumPy on the CPU and as torch ops elsewhere (CUDA)."""
    torch.manual_seed(0)
    delta, carry, valid = torch.randn(17, 9), torch.rand(17, 9), (torch.rand(17, 9) > 0.1).float()
    by_numpy = targets.backward_recursion(delta, carry, valid, numpy=True)
    torch.testing.assert_close(by_numpy, targets.backward_recursion(delta, carry, valid, numpy=False))
    expected, last = np.zeros((17, 9), np.float32), np.zeros(9, np.float32)
    for t in reversed(range(17)):
        last = (delta[t].numpy() + carry[t].numpy() * last) * valid[t].numpy()
        expected[t] = last
    np.testing.assert_allclose(by_numpy.numpy(), expected, rtol=1e-6)
