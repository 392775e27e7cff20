"""Bad input is one line: flags matched exactly, a user's own module found in the directory the command
runs from (or one line saying where it was looked for, or where it failed), an env that changes its
spaces, a checkpoint of another env or model, a log that cannot be written."""

import glob
import os
import subprocess
import sys

import pytest
from conftest import REPO, TINY, files_of, main_error, one_line_error, read_json, run_train, train_error

GO_RIGHT = """
import gymnasium as gym
import numpy as np


class GoRight(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.position = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.position = max(0, self.position + (1 if action == 1 else -1))
        done = self.position == 10
        return np.array([self.position / 10], np.float32), float(done), done, False, {}


def broken():
    raise ValueError("no such level")
"""

# another observation size in a worker process than in the main process, which probes the env
SHIFTY = """
import multiprocessing

from user_go_right import GoRight
import gymnasium as gym
import numpy as np

SIZE = 1 if multiprocessing.parent_process() is None else 2


class Shifty(GoRight):
    observation_space = gym.spaces.Box(0.0, 1.0, (SIZE,), np.float32)

    def reset(self, seed=None, options=None):
        return np.zeros(SIZE, np.float32), {}

    def step(self, action):
        return np.zeros(SIZE, np.float32), 0.0, False, True, {}


class Growing(GoRight):
    \"\"\"Its observation grows by one at every reset.\"\"\"

    def reset(self, seed=None, options=None):
        self.size = getattr(self, "size", 0) + 1
        self.observation_space = gym.spaces.Box(0.0, 1.0, (self.size,), np.float32)
        return np.zeros(self.size, np.float32), {}
"""

ASYNC = ["--num_workers", "2", "--num_envs_per_worker", "8", "--batch_size", "256", "--train_for_env_steps", "4000"]


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """The directory the command runs from, holding the user's modules (user_go_right.py, user_shifty.py):
    the current directory of this process; sys.path and the modules imported from it are put back after."""
    (tmp_path / "user_go_right.py").write_text(GO_RIGHT)
    (tmp_path / "user_shifty.py").write_text(SHIFTY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    for name in [name for name, module in sys.modules.items() if str(tmp_path) in str(getattr(module, "__file__", ""))]:
        del sys.modules[name]


# ---- flags ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, line",
    [
        (["--train_for_second", "10"], "error: unknown flag --train_for_second: did you mean --train_for_seconds?"),
        (["--num_worker", "2"], "error: unknown flag --num_worker: did you mean --num_workers?"),
        (["--train_for_second=10"], "error: unknown flag --train_for_second: did you mean --train_for_seconds?"),
        (["--num_workers", "x"], "error: --num_workers: expected an integer or 'auto', got 'x'"),
        (["--num_workers=x"], "error: --num_workers: expected an integer or 'auto', got 'x'"),
        (["--zzzzqqq", "1"], "error: unknown flag --zzzzqqq: --help lists the flags"),
        (["stray"], "error: unexpected argument 'stray'"),
    ],
)
def test_a_flag_is_matched_exactly_and_an_unknown_one_names_the_closest(tmp_path, args, line, capsys):
    assert train_error(args, tmp_path, capsys).startswith(line)
    assert os.listdir(tmp_path) == []


@pytest.mark.e2e
def test_an_unknown_flag_is_one_line_without_the_usage(tmp_path):
    line = one_line_error(run_train(["--num_worker", "2"], tmp_path))
    assert line == "error: unknown flag --num_worker: did you mean --num_workers?"


def test_the_replay_and_export_flags_are_matched_exactly_too(tmp_path, capsys):
    from sf_engine.play.enjoy import main as enjoy_main
    from sf_engine.play.export import main as export_main

    line = main_error(enjoy_main, ["--train_dir", str(tmp_path), "--num_episode", "3"], capsys)
    assert line == "error: unknown flag --num_episode: did you mean --num_episodes?"
    line = main_error(export_main, ["--train_dir", str(tmp_path), "--form", "onnx"], capsys)
    assert line == "error: unknown flag --form: did you mean --format?"
    assert "--num_episodes: invalid int value" in main_error(enjoy_main, ["--num_episodes", "x"], capsys)


# ---- a user's own module ----------------------------------------------------------------------------
def _train_in(directory, env_id: str, experiment: str, shm_dir: str, **kwargs):
    """train.py run from `directory` as a user runs it there, an async run into `directory`/runs."""
    command = [sys.executable, os.path.join(REPO, "train.py"), "--env", env_id, "--train_dir", "runs"]
    command += ["--experiment", experiment, "--shm_dir", shm_dir] + ASYNC
    return subprocess.run(command, cwd=directory, capture_output=True, text=True, timeout=180, **kwargs)


@pytest.mark.e2e
def test_a_users_module_in_the_current_directory_trains_in_async_mode(tmp_path, shm_dir):
    (tmp_path / "my_training.py").write_text(GO_RIGHT)
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = _train_in(tmp_path, "my_training:GoRight", "mine", shm_dir, env=environ)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_json(tmp_path / "runs" / "mine" / "summary.json")
    assert summary["mode"] == "async" and summary["env_steps"] >= 4000 and summary["worker_restarts"] == 0


def test_a_module_not_found_says_where_it_was_looked_for(user_dir, monkeypatch, capsys):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    line = train_error(["--env", "my_trainin:GoRight"], user_dir / "runs", capsys)
    assert f"./my_trainin.py not found in {user_dir} (the current directory)" in line
    assert line.index("./my_trainin.py") < line.index("PYTHONPATH (not set)") < line.index("pip install")


@pytest.mark.parametrize(
    "source, words",
    [
        ("import os\n\nSIZE = int('x')\n", ["ValueError: invalid literal for int()", "(user_module.py:3)"]),
        ("def f(:\n", ["SyntaxError: ", "(user_module.py:1)"]),
        (
            "import gym_not_installed_anywhere\n",
            ["ModuleNotFoundError: No module named 'gym_not_installed_anywhere' (user_module.py:1)", "pip install"],
        ),
    ],
)
def test_a_module_that_fails_on_import_is_one_line_with_where_it_failed(user_dir, source, words, capsys):
    (user_dir / "user_module.py").write_text(source)
    line = train_error(["--env", "user_module:Env"], user_dir / "runs", capsys)
    assert line.startswith("error: --env user_module:Env: importing user_module failed: ")
    for word in words:
        assert word in line


@pytest.mark.parametrize(
    "env, words",
    [
        ("user_go_right:GoRigth", ["user_go_right (user_go_right.py) has no 'GoRigth'", "user_go_right:GoRight?"]),
        ("user_go_right:broken", ["making the env raised ValueError: no such level (user_go_right.py:22)"]),
        ("user_shifty:Growing", ["the second reset() has observation obs float32[2]", "the first had", "[1]"]),
    ],
)
def test_a_bad_attribute_factory_or_env_is_one_line(user_dir, env, words, capsys):
    line = train_error(["--env", env], user_dir / "runs", capsys)
    for word in [f"--env {env}: "] + words:
        assert word in line
    assert not os.path.exists(user_dir / "runs")


def test_an_opponent_module_in_the_current_directory_is_found(user_dir):
    from sf_engine.play.matches import OpponentError, _import_function

    (user_dir / "user_players.py").write_text("def first_legal(observation):\n    return 0\n")
    assert _import_function("user_players:first_legal")(None) == 0
    with pytest.raises(OpponentError, match=r"user_players:first_legl.*did you mean user_players:first_legal\?"):
        _import_function("user_players:first_legl")


def test_an_env_made_with_other_spaces_than_the_probed_one_is_refused(user_dir):
    import dataclasses

    from sf_engine.envs import EnvError, make_batch_env, probe_env_spec

    spec = probe_env_spec("user_go_right:GoRight", "auto")
    other = dataclasses.replace(spec, obs=(("obs", (2,), "float32"),))
    with pytest.raises(EnvError, match=r"has observation obs float32\[1\].* where the probed env had .*float32\[2\]"):
        make_batch_env("user_go_right:GoRight", "auto", 2, seed=0, spec=other)


@pytest.mark.e2e
def test_a_worker_whose_env_differs_from_the_probe_stops_the_run_with_one_line(tmp_path, shm_dir):
    (tmp_path / "user_go_right.py").write_text(GO_RIGHT)
    (tmp_path / "user_shifty.py").write_text(SHIFTY)
    result = _train_in(tmp_path, "user_shifty:Shifty", "shifty", shm_dir)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "restarted" not in result.stdout and "Traceback" not in result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("stopped: ")]
    assert "rollout worker" in line and "observation obs float32[2]" in line and "the probed env had" in line
    assert line in open(tmp_path / "runs" / "shifty" / "train.log").read()


# ---- resuming and replaying -------------------------------------------------------------------------
def _train(tmp_path, shm_dir, experiment, *flags):
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    argv = ["--experiment", experiment, "--train_dir", str(tmp_path), "--shm_dir", shm_dir] + TINY
    assert run(build_plan(argv + ["--train_for_env_steps", "600"] + list(flags))) == 0
    return argv


def test_a_resume_names_each_changed_flag_with_its_old_and_new_value(tmp_path, shm_dir, capsys):
    from sf_engine.run.plan import build_plan

    argv = _train(tmp_path, shm_dir, "resumed", "--hidden_size", "32", "--learning_rate", "0.002")
    before = files_of(tmp_path / "resumed")
    line = train_error(argv + ["--hidden_size", "48", "--train_for_env_steps", "1200"], tmp_path, capsys)
    assert "--hidden_size was 32, now 48" in line and "--restart" in line
    assert files_of(tmp_path / "resumed") == before
    plan = build_plan(argv + ["--hidden_size", "32", "--learning_rate", "0.001", "--train_for_env_steps", "1200"])
    (note,) = [note for note in plan.notes if "changed flags" in note]
    assert note == "resuming with changed flags: --learning_rate 0.002 -> 0.001, --train_for_env_steps 600 -> 1200"
    plan = build_plan(argv + ["--hidden_size", "32", "--learning_rate", "0.002", "--train_for_env_steps", "600"])
    assert not [note for note in plan.notes if "changed flags" in note]  # the same command: nothing changed


def test_a_checkpoint_of_another_env_or_model_names_what_differs_and_a_replay_says_why_gymnasium(
    tmp_path, shm_dir, capsys
):
    from sf_engine.play.enjoy import main
    from sf_engine.runtime.checkpoint import load_checkpoint, save_state_atomic

    _train(tmp_path, shm_dir, "cartpole", "--hidden_size", "32")
    _train(tmp_path, shm_dir, "acrobot", "--env", "Acrobot-v1", "--hidden_size", "16")  # on EnvPool
    acrobot = glob.glob(str(tmp_path / "acrobot" / "checkpoints" / "checkpoint_*.pt"))[0]
    replay = ["--train_dir", str(tmp_path), "--experiment", "cartpole", "--checkpoint"]
    line = main_error(main, replay + [acrobot], capsys)
    assert "does not fit experiment cartpole" in line
    assert "--env Acrobot-v1 (experiment: CartPole-v1), --hidden_size 16 (experiment: 32)" in line
    state = load_checkpoint(acrobot)  # a checkpoint without its configuration: the weights' shapes differ
    del state["config"]
    bare = str(tmp_path / "bare.pt")
    save_state_atomic(bare, state)
    line = main_error(main, replay + [bare], capsys)
    assert "does not fit the model of experiment cartpole" in line and "in the checkpoint" in line, line
    video = ["--video", str(tmp_path / "acrobot.gif"), "--num_episodes", "1", "--max_episode_steps", "5"]
    assert main(["--train_dir", str(tmp_path), "--experiment", "acrobot"] + video) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        "Acrobot-v1: EnvPool, which it was trained on, has no renderer: the replay plays Gymnasium's "
        "implementation of the same env"
    )


# ---- the run's log ----------------------------------------------------------------------------------
def test_a_log_that_cannot_be_written_is_one_line_and_the_run_goes_on(tmp_path, shm_dir, capsys):
    os.makedirs(tmp_path / "full")
    os.symlink("/dev/full", tmp_path / "full" / "train.log")  # every write fails: No space left on device
    _train(tmp_path, shm_dir, "full")
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"warning: cannot write the run's log {tmp_path}/full/train.log (No space left on device): its lines "
        f"are no longer saved there, the run goes on"
    ]
    assert read_json(tmp_path / "full" / "summary.json")["env_steps"] >= 600


def test_a_second_copy_of_a_running_experiment_is_refused_before_the_env_is_probed(tmp_path, capsys, monkeypatch):
    import fcntl

    from sf_engine.run import plan

    os.makedirs(tmp_path / "busy")
    with open(tmp_path / "busy" / ".lock", "a+") as held:  # the running copy's lock
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        before = files_of(tmp_path)

        def probed(*args, **kwargs):
            raise AssertionError("the env was probed before the lock was checked")

        monkeypatch.setattr(plan, "probe_env_spec", probed)
        line = train_error(["--experiment", "busy", "--mode", "serial"], tmp_path, capsys)
    assert "--experiment busy is already running in another process" in line
    assert files_of(tmp_path) == before


@pytest.mark.parametrize("given, meant", [("cartpole", "CartPole-v1"), ("pendulum", "Pendulum-v1")])
def test_a_misspelt_env_id_gets_the_closest_known_id(tmp_path, capsys, given, meant):
    line = train_error(["--env", given, "--mode", "serial"], tmp_path, capsys)
    assert f"--env {given}: unknown environment id" in line and f"did you mean --env {meant}?" in line
    assert not os.path.exists(tmp_path / "default")


def test_a_factory_without_render_mode_is_one_line_when_a_video_needs_it(monkeypatch):
    from sf_engine.envs import EnvError, make_batch_env, probe_env_spec, register_env, registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # the registration ends with the test
    register_env("NoRenderMode-v0", lambda: __import__("gymnasium").make("CartPole-v1"))
    spec = probe_env_spec("NoRenderMode-v0", "gymnasium")
    with pytest.raises(EnvError) as error:
        make_batch_env("NoRenderMode-v0", "gymnasium", 1, 0, spec, render_mode="rgb_array")
    assert "takes no render_mode" in str(error.value) and "render_mode=None parameter" in str(error.value)
