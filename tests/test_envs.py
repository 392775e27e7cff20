"""Env families, spaces and models: each family trains in serial mode, user envs, episode boundaries,
true game score under episodic life, uint8 images bit-exact, bad env input."""

import os
import sys
import textwrap

import numpy as np
import pytest
from conftest import REPO, SerialRun, read_json, serial_plan, train_error

from sf_engine.algo.base import TrainResult
from sf_engine.envs import make_batch_env, probe_env_spec
from sf_engine.run.runner import run
from sf_engine.stats.messages import Episodes

TESTS = os.path.dirname(os.path.abspath(__file__))


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.e2e
@pytest.mark.parametrize(
    "env, flags, family, encoder",
    [
        ("Pong-v5", ["--train_for_env_steps", "400"], "atari", "nature_cnn"),
        ("Breakout-v5", ["--train_for_env_steps", "400", "--encoder", "impala_cnn"], "atari", "impala_cnn"),
        ("HalfCheetah-v4", ["--train_for_env_steps", "2000"], "continuous", "mlp"),
        ("Acrobot-v1", ["--env_backend", "gymnasium", "--train_for_env_steps", "2000"], "classic", "mlp"),
        ("Pendulum-v1", ["--train_for_env_steps", "2000"], "continuous", "mlp"),
        ("BipedalWalker-v3", ["--train_for_env_steps", "2000"], "box2d", "mlp"),
        ("LunarLander-v3", ["--train_for_env_steps", "2000"], "box2d", "mlp"),
        ("toy_envs:ToyDictEnv", ["--train_for_env_steps", "2000", "--actor_critic", "separate"], "image", "nature_cnn"),
        ("toy_envs:ToyHWCImageEnv", ["--train_for_env_steps", "2000"], "image", "nature_cnn"),
    ],
)
def test_each_family_constructs_steps_and_trains(tmp_path, shm_dir, env, flags, family, encoder):
    plan = serial_plan(tmp_path, shm_dir, env, *flags)
    cfg = plan.cfg
    assert plan.spec.family == family and cfg.model.encoder == encoder  # 'auto' resolved in the plan
    assert run(plan) == 0
    summary = read_json(tmp_path / "family" / "summary.json")
    assert summary["learner_version"] >= 2 and summary["env_steps"] >= cfg.run.train_for_env_steps
    if family == "atari":
        assert summary["frames"] == 4 * summary["env_steps"]  # frames count the frameskip
    assert os.listdir(shm_dir) == []


def test_family_defaults_yield_to_the_users_flags(tmp_path, shm_dir):
    cfg = serial_plan(tmp_path, shm_dir, "Pong-v5").cfg
    assert (cfg.learner.learning_rate, cfg.ppo.ppo_clip_ratio, cfg.learner.num_epochs) == (2.5e-4, 0.1, 1)
    assert cfg.sampler.rollout == 16  # given on the command line
    continuous = serial_plan(tmp_path, shm_dir, "HalfCheetah-v4").cfg
    assert continuous.model.normalize_input and continuous.model.normalize_returns
    assert continuous.model.actor_critic == "separate" and cfg.model.actor_critic == "shared"


def test_box2d_games_get_zoos_horizon_under_ppo_and_their_own_under_the_off_policy_family(tmp_path, shm_dir):
    from sf_engine.envs.families import is_box2d

    games = ("LunarLander-v3", "gymnasium:BipedalWalker-v3", "CartPole-v1")
    assert [is_box2d(env) for env in games] == [True, True, False]
    ppo = serial_plan(tmp_path, shm_dir, "LunarLanderContinuous-v3").cfg
    assert (ppo.learner.gamma, ppo.ppo.gae_lambda, ppo.ppo.entropy_coeff) == (0.999, 0.95, 0.01)
    assert ppo.model.normalize_input and ppo.model.actor_critic == "separate"
    sac = serial_plan(tmp_path, shm_dir, "LunarLanderContinuous-v3", "--algo", "sac").cfg
    assert sac.learner.gamma == 0.99 and not sac.model.normalize_input and sac.model.hidden_size == 256
    assert serial_plan(tmp_path, shm_dir, "LunarLander-v3", "--gamma", "0.98").cfg.learner.gamma == 0.98


def _next_value(value: int) -> int:
    """ToyDictEnv's image value one env step later: steps 0..5 of episode e are 10e..10e+5."""
    return value + 1 if value % 10 < 5 else (value // 10 + 1) * 10 % 256


def test_uint8_images_arrive_bit_exact_and_reset_steps_are_masked(tmp_path, shm_dir):
    plan = serial_plan(
        tmp_path, shm_dir, "toy_envs:ToyDictEnv", "--rollout", "8", "--batch_size", "64", "--num_batches_per_epoch", "1"
    )
    cfg, roles = plan.cfg, SerialRun(plan, tmp_path)
    batch = roles.learner.source.gather(roles.full_slots(cfg.slots_per_batch)[: cfg.slots_per_batch])
    image = batch.obs["image"]
    assert image.dtype.is_floating_point is False and str(image.dtype) == "torch.uint8"
    values = image.numpy()[:, :, 0, 0, 0].astype(int)  # [T+1, N]
    assert (image.numpy() == values[:, :, None, None, None]).all()  # every pixel intact
    for t in range(values.shape[0] - 1):
        np.testing.assert_array_equal(values[t + 1], [_next_value(v) for v in values[t]])
    # the step that follows an episode end is the env's reset step: never a valid transition
    ends = batch.terminated.numpy()
    valid = batch.valid.numpy()
    np.testing.assert_array_equal(valid[1:], ~ends[:-1])
    assert ((values[:-1] % 10 == 5) == ~valid).all()  # terminal obs rows are exactly the invalid ones
    roles.close()


@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])  # EnvPool's, and Gymnasium's vectorized CartPole
def test_next_step_reset_is_never_trained_on(tmp_path, shm_dir, backend):
    plan = serial_plan(
        tmp_path,
        shm_dir,
        "CartPole-v1",
        "--rollout",
        "64",
        "--batch_size",
        "256",
        "--num_batches_per_epoch",
        "1",
        "--env_backend",
        backend,
    )
    cfg, roles = plan.cfg, SerialRun(plan, tmp_path)
    slots = roles.full_slots(cfg.slots_per_batch)[: cfg.slots_per_batch]
    batch = roles.learner.source.gather(slots)
    dones = (batch.terminated | batch.truncated).numpy()
    valid = batch.valid.numpy()
    assert dones.any()
    np.testing.assert_array_equal(valid[1:], ~dones[:-1])
    trained = []
    algorithm = roles.learner.policies[0].algorithm
    algorithm._ppo_epochs = lambda samples: trained.append(samples.log_probs.numel()) or TrainResult(0)
    roles.learner.train_on(slots)
    assert trained == [int(valid.sum())]
    roles.worker.send_stats()
    messages = roles.messages(Episodes)
    lengths = [length for m in messages for length in m.lengths]
    assert sum(m.count for m in messages) > 0 and all(length >= 8 for length in lengths)
    roles.close()


@pytest.mark.e2e
def test_true_game_score_is_tracked_across_lives():
    spec = probe_env_spec("Breakout-v5", "auto")
    env = make_batch_env("Breakout-v5", "auto", 4, seed=3, spec=spec, training=True)
    env.reset()
    rng = np.random.default_rng(0)
    life_losses, games = np.zeros(4, int), np.zeros(4, int)
    clipped, scores = [], []
    for _ in range(800):  # about three whole games per env
        result = env.step(rng.integers(0, 4, size=4))
        life_losses += result.terminated
        games += result.episode_over
        clipped.append(result.rewards)
        scores.append(result.score_rewards)
    env.close()
    assert games.sum() >= 4
    # training sees an episode end at every lost life, the reported episode is the whole 5-life game
    assert (life_losses >= 5 * games).all() and (life_losses < 5 * (games + 1)).all()
    clipped, scores = np.array(clipped), np.array(scores)
    assert set(np.unique(clipped)) <= {0.0, 1.0} and scores.sum() >= clipped.sum()


GYM = ["--env_backend", "gymnasium"]  # EnvPool has its own LunarLander-v3 and HalfCheetah-v5


@pytest.mark.parametrize(
    "env, words, extra",
    [
        ("toy_envs:NoSuchEnv", ["--env toy_envs:NoSuchEnv", "cannot import"], []),
        (
            "no_such_module:Env",
            ["--env no_such_module:Env", "cannot import", "module 'no_such_module'", "pip install"],
            [],
        ),
        pytest.param(
            "LunarLander-v3",
            ["--env LunarLander-v3", 'pip install "gymnasium[box2d]"'],
            GYM,
            marks=pytest.mark.skipif(_installed("Box2D"), reason="Box2D is installed here"),
        ),
        pytest.param(
            "HalfCheetah-v5",
            ["--env HalfCheetah-v5", 'pip install "gymnasium[mujoco]"'],
            GYM,
            marks=pytest.mark.skipif(_installed("mujoco"), reason="MuJoCo is installed here"),
        ),
        pytest.param(
            "ALE/Pong-v5",
            ["--env ALE/Pong-v5", "pip install ale-py", "--env ale_py:ALE/Pong-v5"],
            [],
            marks=pytest.mark.skipif(_installed("ale_py"), reason="ale-py is installed here"),
        ),
        ("toy_envs:BadResetEnv", ["--env toy_envs:BadResetEnv", "reset()"], []),
        ("toy_envs:DiscreteObsEnv", ["--env toy_envs:DiscreteObsEnv", "observation"], []),
    ],
)
def test_bad_env_is_one_line_before_workers_start(tmp_path, shm_dir, env, words, extra, capsys):
    line = train_error(["--env", env, "--shm_dir", shm_dir] + extra, tmp_path, capsys)
    for word in words:
        assert word in line
    assert os.listdir(shm_dir) == [] and os.listdir(tmp_path) == []


def test_discrete_action_start_offset_reaches_the_env(monkeypatch):
    import gymnasium as gym
    from gymnasium import spaces

    seen = []

    class Offset(gym.Env):
        observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        action_space = spaces.Discrete(3, start=-1)

        def reset(self, seed=None, options=None):
            return np.zeros(1, np.float32), {}

        def step(self, action):
            seen.append(int(action))
            return np.zeros(1, np.float32), 0.0, False, False, {}

    from sf_engine.envs import register_env, registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # a local class: registered for this test only
    register_env("Offset-v0", Offset)
    spec = probe_env_spec("Offset-v0", "auto")
    env = make_batch_env("Offset-v0", "auto", 2, seed=0, spec=spec)
    env.reset()
    env.step(np.array([0, 2]))
    assert seen == [-1, 1]


@pytest.mark.e2e
def test_env_registered_in_a_users_script_trains_in_async_mode(tmp_path, shm_dir):
    script = tmp_path / "my_training.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{REPO!r}, {TESTS!r}]
        from sf_engine.envs import register_env
        from toy_envs import ToyDictEnv


        def make_toy():
            return ToyDictEnv()


        if __name__ == "__main__":
            register_env("MyToy-v0", make_toy)
            from sf_engine.run.runner import main
            sys.exit(main(sys.argv[1:]))
    """)
    )
    import subprocess

    result = subprocess.run(
        [
            sys.executable,
            str(script),
            "--env",
            "MyToy-v0",
            "--train_dir",
            str(tmp_path),
            "--experiment",
            "mine",
            "--shm_dir",
            shm_dir,
            "--num_workers",
            "2",
            "--num_envs_per_worker",
            "8",
            "--batch_size",
            "256",
            "--train_for_env_steps",
            "8000",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_json(tmp_path / "mine" / "summary.json")
    assert summary["episodes"] > 100 and summary["learner_version"] >= 2


@pytest.mark.parametrize(
    "env, backend", [("CartPole-v1", "envpool"), ("Acrobot-v1", "gymnasium"), ("CartPole-v1", "gymnasium")]
)
def test_any_integer_seed_works_on_every_backend(env, backend):
    spec = probe_env_spec(env, backend)
    for seed in (-5, 0, 2**31 - 1, 2**40, -(2**70)):
        first = make_batch_env(env, backend, 3, seed=seed, spec=spec)
        second = make_batch_env(env, backend, 3, seed=seed, spec=spec)
        np.testing.assert_array_equal(first.reset()["obs"], second.reset()["obs"])  # the seed decides
        first.close()
        second.close()


def test_auto_prefers_gymnasiums_vectorized_implementation_then_envpool():
    from sf_engine.envs.registry import resolve_backend

    assert resolve_backend("CartPole-v1", "auto") == "gymnasium"  # one NumPy-vectorized env object
    assert resolve_backend("CartPoleNoVel-v1", "auto") == "gymnasium"
    assert resolve_backend("Acrobot-v1", "auto") == "envpool"  # Gymnasium steps it env by env
    env = make_batch_env("CartPole-v1", "gymnasium", 5, seed=0, spec=probe_env_spec("CartPole-v1", "auto"))
    assert type(env._env).__name__ == "CartPoleVectorEnv" and env.reset()["obs"].shape == (5, 4)
    env.close()


def test_a_run_takes_any_integer_seed(tmp_path, shm_dir):
    for seed in ("-1", str(2**70)):
        plan = serial_plan(
            tmp_path, shm_dir, "CartPole-v1", "--seed", seed, "--train_for_env_steps", "500", "--restart"
        )
        assert run(plan) == 0


_WITHOUT_ENVPOOL = (
    "import sys; sys.modules['envpool'] = None; from sf_engine.{} import main; "
    "sys.exit(main(sys.argv[1:]))"
)  # as on a machine where EnvPool is not installed


@pytest.mark.e2e
def test_without_envpool_auto_plays_gymnasium_and_envpool_is_one_line_with_the_install_command(tmp_path, shm_dir):
    import subprocess

    from conftest import one_line_error

    def without_envpool(module, *args):
        return subprocess.run(
            [sys.executable, "-c", _WITHOUT_ENVPOOL.format(module), "--train_dir", str(tmp_path)] + list(args),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=180,
        )

    serial = [
        "--mode",
        "serial",
        "--shm_dir",
        shm_dir,
        "--num_workers",
        "1",
        "--num_envs_per_worker",
        "8",
        "--batch_size",
        "256",
        "--train_for_env_steps",
        "2000",
    ]
    result = without_envpool("run.runner", "--experiment", "gym", *serial)
    assert result.returncode == 0, result.stderr
    assert read_json(tmp_path / "gym" / "config.json")["env"]["env_backend"] == "gymnasium"
    line = one_line_error(without_envpool("run.runner", "--experiment", "pool", "--env_backend", "envpool", *serial))
    assert "pip install envpool" in line and not (tmp_path / "pool").exists()
    assert (
        run(
            serial_plan(
                tmp_path,
                shm_dir,
                "CartPole-v1",
                "--experiment",
                "pool",
                "--env_backend",
                "envpool",
                "--train_for_env_steps",
                "2000",
            )
        )
        == 0
    )
    assert read_json(tmp_path / "pool" / "config.json")["env"]["env_backend"] == "envpool"
    line = one_line_error(without_envpool("play.enjoy", "--experiment", "pool", "--num_episodes", "1"))
    assert "pip install envpool" in line
