"""Action masks (an observation entry 'action_mask', as PettingZoo gives it): illegal actions are never
taken, the log-probs and entropies of the loss cover legal actions only (against a reference), and a
mask that does not fit the action space is one line."""

import os

import numpy as np
import pytest
import torch
from conftest import read_json, train_error

from sf_engine.config.groups import ModelConfig
from sf_engine.envs import probe_env_spec
from sf_engine.model.actor_critic import ActorCritic
from sf_engine.model.shape import resolve_model_config
from sf_engine.run.plan import build_plan
from sf_engine.run.runner import run


def _masked_batch(batch: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    mask = (rng.random((batch, 5)) < 0.5).astype(np.float32)
    mask[np.arange(batch), rng.integers(0, 5, batch)] = 1.0  # at least one legal action per row
    return {"obs": torch.from_numpy(rng.random((batch, 5), dtype=np.float32)), "action_mask": torch.from_numpy(mask)}


def test_masked_log_probs_entropies_and_gradients_match_a_reference():
    """Against the categorical of the legal actions' logits alone: log-probs, entropies and their
    gradients (none reaches an illegal logit); samples and greedy actions are legal."""
    spec = probe_env_spec("toy_envs:MaskedChoiceEnv", "auto")
    assert spec.action_mask
    model = ActorCritic(spec, resolve_model_config(ModelConfig(), spec))
    obs = _masked_batch(256)
    legal = obs["action_mask"].bool()
    raw = (torch.randn(256, 5) * 3).requires_grad_()
    actions = torch.multinomial(legal.float(), 1).squeeze(1)  # a legal action per row
    log_prob, entropy = model.log_prob_entropy(model.legal(raw, obs), actions)
    (grad,) = torch.autograd.grad((log_prob + 0.1 * entropy).sum(), raw)

    reference = raw.detach().clone().requires_grad_()
    log_pi = torch.where(legal, reference, torch.tensor(float("-inf"))).log_softmax(-1)
    ref_log_prob = log_pi.gather(1, actions.unsqueeze(1)).squeeze(1)
    ref_entropy = -(log_pi.exp() * torch.where(legal, log_pi, torch.zeros(()))).sum(-1)
    (ref_grad,) = torch.autograd.grad((ref_log_prob + 0.1 * ref_entropy).sum(), reference)
    torch.testing.assert_close(log_prob, ref_log_prob, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-6)
    assert not grad[~legal].any()

    with torch.no_grad():
        for _ in range(20):
            sampled, _, _, _ = model.sample(obs)
            assert legal[torch.arange(256), sampled].all()
        params, _ = model(obs)
        assert legal[torch.arange(256), model.distribution.mode(params)].all()


@pytest.mark.parametrize("env", ["toy_envs:MaskedChoiceEnv", "toy_envs:InfoMaskChoiceEnv"], ids=["obs", "info"])
def test_masked_env_trains_without_ever_taking_an_illegal_action(tmp_path, shm_dir, env):
    """A serial run of an env whose legal actions change every step, its mask in the observation or in
    the info: no illegal action in any episode, and the policy learns to take the one the observation
    shows (a uniform choice among the legal ones scores about 5.2 of 10)."""
    plan = build_plan(
        [
            "--env",
            env,
            "--train_dir",
            str(tmp_path),
            "--experiment",
            "masked",
            "--mode",
            "serial",
            "--shm_dir",
            shm_dir,
            "--num_workers",
            "1",
            "--num_envs_per_worker",
            "64",
            "--batch_size",
            "1024",
            "--train_for_env_steps",
            "60000",
            "--learning_rate",
            "1e-3",
        ]
    )
    assert run(plan) == 0
    summary = read_json(tmp_path / "masked" / "summary.json")
    assert summary["episode_extra_stats"]["illegal"] == 0.0, summary
    assert summary["episode_return_mean"] > 8.0, summary
    assert os.listdir(shm_dir) == []


@pytest.mark.parametrize(
    "env, words",
    [
        ("toy_envs:BadMaskEnv", ["'action_mask'", "(4,)", "(5,)"]),
        ("toy_envs:BadInfoMaskEnv", ["info['action_mask']", "3 values", "takes 5"]),
    ],
)
def test_a_mask_that_does_not_fit_the_actions_is_one_line(tmp_path, shm_dir, capsys, env, words):
    line = train_error(["--env", env, "--shm_dir", shm_dir], tmp_path, capsys)
    assert f"--env {env}" in line and all(word in line for word in words), line
    assert os.listdir(shm_dir) == [] and os.listdir(tmp_path) == []


def test_multi_discrete_masks_cover_each_sub_action():
    """MultiDiscrete([3, 2]): the mask holds the sub-spaces' masks one after the other (5 values); every
    sampled and greedy sub-action is legal in its own sub-space."""
    from sf_engine.envs import ActionSpec, EnvSpec

    spec = EnvSpec(
        (("obs", (4,), "float32"), ("action_mask", (5,), "float32")),
        ActionSpec("multi_discrete", nvec=(3, 2), start=(0, 0)),
    )
    model = ActorCritic(spec, resolve_model_config(ModelConfig(), spec))
    rng = np.random.default_rng(1)
    mask = np.zeros((128, 5), np.float32)
    mask[np.arange(128), rng.integers(0, 3, 128)] = 1.0  # one legal value of the first sub-action
    mask[:, 3:] = rng.random((128, 2)) < 0.7
    mask[np.arange(128), 3 + rng.integers(0, 2, 128)] = 1.0  # and at least one of the second
    obs = {"obs": torch.randn(128, 4), "action_mask": torch.from_numpy(mask)}
    legal = torch.from_numpy(mask).bool()
    with torch.no_grad():
        for _ in range(10):
            actions, log_probs, _, _ = model.sample(obs)
            assert legal[torch.arange(128), actions[:, 0]].all() and legal[torch.arange(128), 3 + actions[:, 1]].all()
            assert torch.isfinite(log_probs).all()
        greedy = model.distribution.mode(model(obs)[0])
        assert legal[torch.arange(128), greedy[:, 0]].all() and legal[torch.arange(128), 3 + greedy[:, 1]].all()


def test_the_compiled_loss_and_the_recurrent_replay_agree_on_masked_logits():
    """The learner's ways through masked logits: the compiled PPO loss against torch's ops (a row with no
    legal action is left unmasked, so both stay finite and equal), and a recurrent model's sequence
    re-run against its acting steps."""
    from sf_engine.algo.ppo import loss as ppo_loss
    from sf_engine.model import kernels

    spec = probe_env_spec("toy_envs:MaskedChoiceEnv", "auto")
    model = ActorCritic(spec, resolve_model_config(ModelConfig(), spec))
    obs = _masked_batch(64, seed=3)
    obs["action_mask"][5] = 0.0  # no legal action in this row
    with torch.no_grad():
        logits = model(obs)[0]
    assert (logits[5] > -1e8).all() and (logits[6][obs["action_mask"][6] == 0] == -1e9).all()
    actions = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(1)
    args = (
        logits,
        torch.randn(64),
        actions,
        torch.randn(64) - 1.5,
        torch.randn(64),
        torch.randn(64),
        ppo_loss.LossCoefficients(0.2, 0.5, 0.01),
    )
    torch_way = ppo_loss.discrete_loss_and_grads(*args, kernels=False)
    if kernels.KERNELS is not None:
        for ours, reference in zip(ppo_loss.discrete_loss_and_grads(*args, kernels=True), torch_way):
            torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-5)
    assert all(torch.isfinite(t).all() for t in torch_way)

    recurrent = ActorCritic(spec, resolve_model_config(ModelConfig(rnn="gru", rnn_size=16), spec))
    steps = [_masked_batch(8, seed=10 + t) for t in range(4)]
    state = recurrent.initial_state(8)
    with torch.no_grad():
        stepped = []
        for step in steps:
            params, _, state = recurrent(step, state)
            stepped.append(params)
        flat = {key: torch.cat([step[key] for step in steps]) for key in steps[0]}
        replayed, _, _ = recurrent.forward_sequence(
            flat, recurrent.initial_state(8), torch.zeros(4, 8, dtype=torch.bool)
        )
    torch.testing.assert_close(replayed, torch.cat(stepped), rtol=1e-4, atol=1e-5)
    assert (replayed[torch.cat([step["action_mask"] for step in steps]) == 0] == -1e9).all()
