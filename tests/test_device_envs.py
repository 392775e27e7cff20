"""Device envs (envs/device.py's contract): the shipped torch envs against Gymnasium's own, step for step, and the
two autoreset modes with their time limits."""

from __future__ import annotations

import dataclasses

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from sf_engine.envs.device import check_device_env, device_env_class, is_device_env
from sf_engine.envs.spec import EnvError
from sf_engine.envs.torch_envs import TorchPendulum


@pytest.mark.parametrize("name, steps", [("CartPole-v1", 3000), ("Acrobot-v1", 2000), ("Pendulum-v1", 1000)])
def test_each_torch_env_steps_as_gymnasiums_from_the_same_states_and_actions(name, steps):
    """4 Gymnasium envs and the torch batch of 4 from the same states (each Gymnasium reset copied into its row)
    and the same random actions: the same observations, rewards, terminations and truncations at every step
    (a row that ends is compared by its final_obs), across many episodes of each."""
    num_envs, rng = 4, np.random.default_rng(0)
    env = device_env_class(f"Torch{name}")(num_envs)
    env.reset(seed=0)
    references = [gymnasium.make(name) for _ in range(num_envs)]
    for row, reference in enumerate(references):
        reference.reset(seed=row)
        env.state[row] = torch.as_tensor(np.asarray(reference.unwrapped.state, dtype=np.float64))
    ends = {"terminated": 0, "truncated": 0}
    for _ in range(steps):
        if name == "Pendulum-v1":  # beyond the bounds too: both clip
            actions = rng.uniform(-2.5, 2.5, size=(num_envs, 1)).astype(np.float32)
        else:
            actions = rng.integers(0, env.single_action_space.n, size=num_envs)
        obs, reward, terminated, truncated, info = env.step(torch.as_tensor(actions))
        for row, reference in enumerate(references):
            expected_obs, expected_reward, expected_terminated, expected_truncated, _ = reference.step(actions[row])
            np.testing.assert_allclose(info["final_obs"][row].numpy(), expected_obs, rtol=1e-5, atol=1e-5)
            assert reward[row].item() == pytest.approx(expected_reward, rel=1e-5, abs=1e-5)
            assert (terminated[row].item(), truncated[row].item()) == (expected_terminated, expected_truncated)
            if expected_terminated or expected_truncated:
                ends["terminated"] += expected_terminated
                ends["truncated"] += expected_truncated
                reference.reset()
                env.state[row] = torch.as_tensor(np.asarray(reference.unwrapped.state, dtype=np.float64))
    assert ends["terminated"] + ends["truncated"] >= 8, ends  # many episodes compared, not one


def test_next_step_autoreset_ignores_the_action_after_an_end_and_counts_the_time_limit_anew():
    """NEXT_STEP (EnvPool's convention): Pendulum's 200-step limit ends the episode at steps 200, 401 and 602; the
    step after each returns the new episode's first observation, reward 0 and no end."""
    env = TorchPendulum(3, autoreset_mode=AutoresetMode.NEXT_STEP)
    env.reset(seed=1)
    zero = torch.zeros(3, 1)
    truncations, after = [], []
    for step in range(1, 650):
        obs, reward, terminated, truncated, info = env.step(zero)
        assert "final_obs" not in info and not terminated.any()
        if truncated.all():
            truncations.append(step)
        if truncations and step == truncations[-1] + 1:
            after.append((reward.abs().max().item(), truncated.any().item(), env.steps.max().item()))
    assert truncations == [200, 401, 602]
    assert after == [(0.0, False, 0)] * 3


def test_same_step_autoreset_restarts_at_once_and_keeps_the_last_observation():
    """SAME_STEP (Isaac Lab's and Brax's convention): truncated at steps 200, 400 and 600; the ending step returns
    the new episode's first observation, the old one's last in info['final_obs']; other steps' final_obs is the
    observation itself."""
    env = TorchPendulum(3)
    env.reset(seed=1)
    zero, truncations = torch.zeros(3, 1), []
    for step in range(1, 601):
        obs, reward, terminated, truncated, info = env.step(zero)
        if truncated.all():
            truncations.append(step)
            assert not torch.equal(obs, info["final_obs"]) and env.steps.max().item() == 0
        else:
            assert torch.equal(obs, info["final_obs"])
    assert truncations == [200, 400, 600]


def test_a_seed_makes_the_same_episodes():
    runs = []
    for _ in range(2):
        env = device_env_class("TorchCartPole-v1")(8)
        first, _ = env.reset(seed=7)
        rows = [first] + [env.step(torch.ones(8, dtype=torch.int64))[0] for _ in range(40)]
        runs.append(torch.stack(rows))
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(device_env_class("TorchCartPole-v1")(8).reset(seed=8)[0], runs[0][0])


def test_the_contract_is_recognised_and_its_breaches_named_in_one_line():
    env = device_env_class("TorchAcrobot-v1")(2)
    assert is_device_env(env) and not is_device_env(gymnasium.make_vec("CartPole-v1", num_envs=2))
    check_device_env(env, "TorchAcrobot-v1")
    env.metadata = {"autoreset_mode": AutoresetMode.DISABLED}
    with pytest.raises(EnvError, match=r"\[.autoreset_mode.\] must be AutoresetMode.NEXT_STEP or SAME_STEP"):
        check_device_env(env, "TorchAcrobot-v1")
    with pytest.raises(ValueError, match="autoreset_mode"):
        TorchPendulum(2, autoreset_mode=AutoresetMode.DISABLED)


class JaxCountdown:
    """gymnax's functional API in a few lines: observes [step t, last action]; reward 1; terminates at t = 3."""

    default_params = None

    def observation_space(self, params):
        return gymnasium.spaces.Box(0.0, 100.0, (2,), np.float32)

    def action_space(self, params):
        return gymnasium.spaces.Discrete(2)

    def reset(self, key, params):
        import jax.numpy as jnp

        state = jnp.zeros((), jnp.int32)
        return jnp.zeros(2, jnp.float32), state

    def step(self, key, state, action, params):
        import jax.numpy as jnp

        step = state + 1
        last = jnp.stack([step, action]).astype(jnp.float32)
        terminated, truncated = step >= 3, jnp.zeros((), bool)
        obs = jnp.where(terminated, jnp.zeros(2, jnp.float32), last)
        return obs, jnp.where(terminated, 0, step), jnp.float32(1.0), terminated, truncated, {"final_observation": last}


def test_a_jax_env_through_the_bridge_keeps_the_contract_without_copies():
    """A functional JAX env (gymnax's API) as a device env: same-step resets with the last observation kept, ends as
    bools, rewards as float32, and the observations torch tensors on the JAX array's own memory (DLPack)."""
    jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'sf_engine[jax]')")
    from sf_engine.envs.jax_bridge import JaxVectorEnv

    env = JaxVectorEnv(JaxCountdown(), num_envs=3)
    check_device_env(env, "JaxCountdown")
    assert is_device_env(env) and env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3, 2) and obs.dtype == torch.float32
    for step in (1, 2, 3):
        obs, reward, terminated, truncated, info = env.step(torch.tensor([0, 1, 1]))
    assert terminated.dtype == torch.bool and terminated.all() and not truncated.any()
    assert reward.dtype == torch.float32 and reward.tolist() == [1.0] * 3
    assert info["final_obs"].tolist() == [[3.0, 0.0], [3.0, 1.0], [3.0, 1.0]] and obs.abs().sum() == 0
    array = jax.numpy.arange(6.0).reshape(3, 2)
    assert JaxVectorEnv._torch(array).data_ptr() == array.unsafe_buffer_pointer()  # no copy


@dataclasses.dataclass(frozen=True)
class BraxCountdownState:
    """A Brax State's fields: the physics state (the step t, the step it is done at), obs [t, last action], reward,
    done, metrics, info."""

    pipeline_state: dict
    obs: object
    reward: object
    done: object
    metrics: dict
    info: dict


class BraxCountdown:
    """Brax's API in a few lines: observes [t, last action] ([0, u] at a reset, u uniform), reward 1, done at t = 2
    where u < 0.5, else at t = 3; info['steps'] counts every step of the env, across its episodes."""

    observation_size, action_size = 2, 1

    def reset(self, rng):
        import jax
        import jax.numpy as jnp

        u = jax.random.uniform(rng)
        state = {"t": jnp.int32(0), "done_at": jnp.where(u < 0.5, 2, 3)}
        obs = jnp.stack([jnp.float32(0.0), u])
        return BraxCountdownState(state, obs, jnp.float32(0.0), jnp.float32(0.0), {}, {"steps": jnp.int32(0)})

    def step(self, state, action):
        import jax.numpy as jnp

        t = state.pipeline_state["t"] + 1
        return dataclasses.replace(
            state,
            pipeline_state={"t": t, "done_at": state.pipeline_state["done_at"]},
            obs=jnp.stack([t.astype(jnp.float32), action[0]]),
            reward=jnp.float32(1.0),
            done=(t >= state.pipeline_state["done_at"]).astype(jnp.float32),
            info={"steps": state.info["steps"] + 1},
        )


@pytest.mark.parametrize("episode_length", [5, 2])
def test_a_brax_api_env_through_the_bridge_ends_each_episode_and_restarts_it_from_its_first_state(episode_length):
    """An env in Brax's API as a device env, env by env: a termination (done) or `episode_length` steps end an
    episode, the last observation kept; that env goes back to the first state its reset drew (info carries on), the
    others go on."""
    jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'sf_engine[jax]')")
    from sf_engine.envs.jax_bridge import BraxVectorEnv

    if not hasattr(BraxCountdownState, "registered"):  # a pytree, as Brax's State is (once per process)
        jax.tree_util.register_dataclass(BraxCountdownState)
        BraxCountdownState.registered = True
    env = BraxVectorEnv(BraxCountdown(), episode_length, num_envs=8)
    check_device_env(env, "BraxCountdown")
    assert env.single_action_space == gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
    first, _ = env.reset(seed=0)
    first = first.clone()
    done_at = torch.where(first[:, 1] < 0.5, 2, 3)
    assert first[:, 0].eq(0).all() and set(done_at.tolist()) == {2, 3}  # both kinds among the 8
    ends, steps = done_at.clamp(max=episode_length), torch.zeros(8, dtype=torch.long)  # each env's episode steps
    for t in (1, 2, 3):
        obs, reward, terminated, truncated, info = env.step(torch.full((8, 1), t / 10))
        steps += 1
        ended = steps == ends
        assert reward.dtype == torch.float32 and reward.tolist() == [1.0] * 8
        assert torch.equal(terminated, ended & (done_at <= episode_length))
        assert torch.equal(truncated, ended & ~terminated)
        assert torch.equal(info["final_obs"][:, 0], steps.float())  # the last observation, before any restart
        assert torch.equal(obs[ended], first[ended])  # back in the first state its reset drew
        assert torch.equal(obs[~ended, 0], steps[~ended].float())  # the others go on
        steps[ended] = 0
    assert env.state[0].info["steps"].tolist() == [3] * 8  # info carries on


@pytest.mark.parametrize("prefix", ["gymnax/", "brax/", "playground/"])
def test_a_jax_env_id_without_its_package_is_refused_in_one_line_naming_the_install(prefix):
    import importlib.util

    from sf_engine.envs.jax_bridge import JAX_ENV_PREFIXES

    package, install = JAX_ENV_PREFIXES[prefix]
    missing = next((name for name in ("jax", package) if importlib.util.find_spec(name) is None), None)
    if missing is None:
        pytest.skip(f"{package} is installed here")
    with pytest.raises(EnvError, match=rf"^--env {prefix}Some-v0: {missing} is not installed here: pip install "):
        device_env_class(f"{prefix}Some-v0")
