"""MultiBinary, Tuple and Dict action spaces (PPO): their specs, their distributions' log-probabilities and
entropies against torch.distributions, the env's actions of a policy's rows, the replay family's one-line
refusals, and runs that learn to the optimum of the tests' own envs."""

import numpy as np
import pytest
import torch
from conftest import train_error
from gymnasium import spaces

from sf_engine.envs.spec import ActionSpec, EnvError, action_space, action_spec
from sf_engine.model.distributions import ActionDistribution

STEP_BUDGET = 2_000_000  # env steps a learning run may take (the runs stop at their return, long before)

COMPOSITE = spaces.Dict(
    {
        "which": spaces.Discrete(3, start=1),
        "where": spaces.Box(-1.0, 2.0, (2,), np.float32),
        "lights": spaces.MultiBinary(2),
        "dials": spaces.MultiDiscrete([4, 2]),
    }
)


def test_tuple_and_dict_spaces_read_as_composite_specs_and_back():
    spec = action_spec("env", COMPOSITE)
    assert spec.kind == "composite" and spec.keys == tuple(COMPOSITE.spaces)
    kinds = {"which": "discrete", "where": "continuous", "lights": "multi_binary", "dials": "multi_discrete"}
    assert [part.kind for part in spec.parts] == [kinds[key] for key in spec.keys]  # Gymnasium sorts the keys
    assert spec.width == 1 + 2 + 2 + 2 and spec.buffer_shape == (7,) and spec.dtype == "float32"
    assert action_space(spec) == COMPOSITE
    pair = spaces.Tuple((spaces.Discrete(2), spaces.MultiBinary(3)))
    assert action_space(action_spec("env", pair)) == pair
    bits = action_spec("env", spaces.MultiBinary(5))
    assert (bits.kind, bits.buffer_shape, bits.dtype) == ("multi_binary", (5,), "int64")


@pytest.mark.parametrize(
    "space, what",
    [
        (spaces.Tuple((spaces.Discrete(2), spaces.Tuple((spaces.Discrete(2),)))), "(its part 1) is not supported"),
        (spaces.MultiBinary((2, 2)), "MultiBinary((2, 2)) is not supported"),
        (spaces.Dict({"name": spaces.Text(5)}), "(its part 'name') is not supported"),
    ],
)
def test_unsupported_action_spaces_are_one_line_naming_the_part(space, what):
    with pytest.raises(EnvError) as error:
        action_spec("my_env", space)
    line = str(error.value)
    assert "\n" not in line and line.startswith("--env my_env: action space") and what in line
    assert "MultiBinary, a 1-D float Box, or a Tuple or Dict of them" in line


def test_the_env_actions_of_composite_rows_are_in_the_env_space():
    spec = action_spec("env", COMPOSITE)
    assert spec.keys == ("dials", "lights", "where", "which")  # the columns in this order
    rows = np.array([[3, 1, 1, 0, 5.0, -3.0, 2], [0, 0, 0, 1, 0.5, 1.5, 0]], np.float32)
    batch = spec.env_actions(rows)
    assert list(batch) == list(spec.keys)
    assert batch["which"].tolist() == [3, 1]  # Discrete(3, start=1)
    assert batch["where"].tolist() == [[2.0, -1.0], [0.5, 1.5]]  # clipped to the bounds [-1, 2]
    assert batch["lights"].dtype == np.int8 and batch["dials"].tolist() == [[3, 1], [0, 0]]
    for row in rows:
        assert COMPOSITE.contains(spec.env_action(row))
    pair = action_spec("env", spaces.Tuple((spaces.Discrete(2), spaces.Box(0.0, 1.0, (1,), np.float32))))
    one = pair.env_action(np.array([1, 0.25], np.float32))
    assert isinstance(one, tuple) and one[0] == 1 and one[1].tolist() == [0.25]


def _reference(spec: ActionSpec, params, log_std, actions):
    """Log-probabilities and entropies by torch.distributions, part by part."""
    from torch import distributions as D

    log_prob, entropy, p, s, a = 0.0, 0.0, 0, 0, 0
    for part in spec.parts:
        if part.kind == "discrete":
            dist, n = D.Categorical(logits=params[:, p : p + part.nvec[0]]), part.nvec[0]
            chosen = actions[:, a].long()
        elif part.kind == "multi_discrete":
            dists = [D.Categorical(logits=x) for x in params[:, p : p + sum(part.nvec)].split(part.nvec, -1)]
            chosen = actions[:, a : a + part.width].long()
            log_prob = log_prob + sum(d.log_prob(chosen[:, i]) for i, d in enumerate(dists))
            entropy = entropy + sum(d.entropy() for d in dists)
            p, a = p + sum(part.nvec), a + part.width
            continue
        elif part.kind == "multi_binary":
            dist, n = D.Independent(D.Bernoulli(logits=params[:, p : p + part.width]), 1), part.width
            chosen = actions[:, a : a + part.width]
        else:
            n = part.width
            std = log_std[s : s + n].exp().expand(len(params), n)
            dist, chosen, s = D.Independent(D.Normal(params[:, p : p + n], std), 1), actions[:, a : a + n], s + n
        log_prob, entropy = log_prob + dist.log_prob(chosen), entropy + dist.entropy()
        p, a = p + n, a + part.width
    return log_prob, entropy


def test_log_probabilities_and_entropies_match_torch_distributions():
    torch.manual_seed(0)
    spec = action_spec("env", COMPOSITE)
    dist = ActionDistribution(spec)
    assert (dist.num_params, dist.num_std) == (3 + 2 + 2 + 6, 2)
    params, log_std = torch.randn(64, dist.num_params), torch.randn(dist.num_std) * 0.3
    actions, sampled_log_prob = dist.sample(params, log_std)
    assert actions.shape == (64, 7) and actions.dtype == torch.float32
    log_prob, entropy = dist.log_prob_entropy(params, actions, log_std)
    expected_log_prob, expected_entropy = _reference(spec, params, log_std, actions)
    torch.testing.assert_close(log_prob, expected_log_prob)
    torch.testing.assert_close(sampled_log_prob, expected_log_prob)
    torch.testing.assert_close(entropy, expected_entropy)
    assert COMPOSITE.contains(spec.env_action(dist.mode(params)[0].numpy()))

    bits = ActionDistribution(action_spec("env", spaces.MultiBinary(4)))
    logits = torch.randn(256, 4)
    chosen, lp = bits.sample(logits)
    reference = torch.distributions.Independent(torch.distributions.Bernoulli(logits=logits), 1)
    torch.testing.assert_close(lp, reference.log_prob(chosen.float()))
    torch.testing.assert_close(bits.log_prob_entropy(logits, chosen)[1], reference.entropy())
    assert torch.equal(bits.mode(logits), (logits > 0).long())


def test_bits_are_sampled_with_their_probabilities():
    torch.manual_seed(1)
    bits = ActionDistribution(action_spec("env", spaces.MultiBinary(3)))
    logits = torch.tensor([[-2.0, 0.0, 1.5]]).expand(20000, 3)
    frequency = bits.sample(logits)[0].float().mean(0)
    torch.testing.assert_close(frequency, torch.sigmoid(logits[0]), atol=0.015, rtol=0)


@pytest.mark.parametrize("algo, env", [("dqn", "CopyBitsEnv"), ("sac", "PickAndPlaceEnv"), ("r2d2", "CopyBitsEnv")])
def test_the_replay_family_refuses_these_spaces_naming_ppo(tmp_path, capsys, algo, env):
    line = train_error(["--algo", algo, "--env", f"toy_envs:{env}", "--mode", "serial"], tmp_path, capsys)
    assert f"--algo {algo} needs" in line and "--algo ppo" in line


def _first(batch):
    """One env's action of a batch of one (a tuple or dict of batches for a composite action)."""
    if isinstance(batch, dict):
        return {key: value[0] for key, value in batch.items()}
    return tuple(value[0] for value in batch) if isinstance(batch, tuple) else batch[0]


def _greedy_return(policy, env, episodes: int = 20) -> float:
    """The mean return of `policy`'s greedy actions over `episodes` episodes of `env`."""
    total = 0.0
    for seed in range(episodes):
        obs, _ = env.reset(seed=seed)
        over = False
        while not over:
            obs, reward, terminated, truncated, _ = env.step(_first(policy.act(obs[None])))
            total, over = total + reward, terminated or truncated
    return total / episodes


@pytest.mark.e2e
@pytest.mark.parametrize(
    # optima 8 and 16; a Gaussian's samples cost the training return of a Box part, and its mean played greedily
    # lands 15.0 - 15.2 after training to 14.5 (measured over seeds), so the floor asks it to beat its sampled play
    "env, trained, floor",
    [("CopyBitsEnv", 7.8, 7.8), ("PickAndPlaceDictEnv", 14.5, 14.8)],
)
def test_ppo_learns_each_space_to_its_optimum_and_plays_it(tmp_path, shm_dir, capsys, env, trained, floor):
    import toy_envs
    from conftest import enjoy_episodes

    import sf_engine
    from sf_engine.play.export import main as export_main

    where = ["--train_dir", str(tmp_path), "--experiment", env]
    result = sf_engine.train(
        env=f"toy_envs:{env}",
        mode="serial",
        train_dir=str(tmp_path),
        experiment=env,
        shm_dir=shm_dir,
        num_envs_per_worker=32,
        stop_at_return=trained,
        train_for_env_steps=STEP_BUDGET,
    )
    assert result.summary["episode_return_mean"] >= trained, result.summary
    policy = sf_engine.load_policy(result.experiment_dir)
    assert _greedy_return(policy, getattr(toy_envs, env)()) >= floor
    capsys.readouterr()
    episodes = enjoy_episodes(capsys, *where, "--deterministic")
    assert len(episodes) == 2 and min(float(ret) for ret, _ in episodes) >= floor - 1, episodes
    assert export_main(where + ["--format", "torchscript"]) == 0
