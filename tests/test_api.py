"""The public Python API as a user calls it: sf_engine.train returns a RunResult, load_policy acts, observers
see every report, checkpoint and evaluation and can stop a run, a bad flag is train.py's one line, and a
script may train several times leaving nothing behind."""

import os
import re
import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest
from conftest import REPO, files_of, read_json, train_error

import sf_engine

SMALL = dict(mode="serial", num_workers=1, num_envs_per_worker=8, rollout=32, batch_size=256)


def _train(tmp_path, shm_dir, **flags):
    return sf_engine.train(train_dir=str(tmp_path), shm_dir=shm_dir, **(SMALL | flags))


class Recorder:
    """Every call an observer gets; asks to stop at the report where `stop_when(figures)` holds."""

    def __init__(self, stop_when=lambda figures: False):
        self.reports, self.checkpoints, self.evaluations, self.stop_when = [], [], [], stop_when

    def on_report(self, figures):
        self.reports.append(figures)
        return self.stop_when(figures)

    def on_checkpoint(self, path):
        assert os.path.isfile(path)
        self.checkpoints.append(path)

    def on_evaluation(self, figures):
        self.evaluations.append(figures)


@pytest.mark.e2e
def test_train_returns_the_run_and_load_policy_acts_as_enjoy_does(tmp_path, shm_dir):
    recorder = Recorder()
    result = _train(
        tmp_path, shm_dir, experiment="api", train_for_env_steps=30_000, eval_every_sec=1, observers=[recorder]
    )
    assert result.experiment_dir == os.path.join(str(tmp_path), "api")
    assert result.summary == read_json(os.path.join(result.experiment_dir, "summary.json"))
    assert result.summary["env_steps"] >= 30_000 and "env-step budget" in result.stop_reason
    assert os.path.isfile(result.checkpoint) and result.checkpoint == recorder.checkpoints[-1]
    # the observer saw what summary.json, TensorBoard and the terminal saw
    assert recorder.reports[-1].final and dict(recorder.reports[-1]) == result.summary
    assert not any(figures.final for figures in recorder.reports[:-1])
    assert "episode/return" in recorder.reports[-1].scalars and "env steps" in recorder.reports[-2].status
    assert recorder.evaluations and {"version", "return_mean", "episodes"} <= set(recorder.evaluations[0])
    again = _train(tmp_path, shm_dir, experiment="api", train_for_env_steps=30_000)  # its budget is spent
    assert "has nothing to train" in again.stop_reason
    assert again.checkpoint == result.checkpoint and again.summary == result.summary

    policy = sf_engine.load_policy(result.experiment_dir)
    assert policy.checkpoint == result.checkpoint
    env = gym.make_vec("CartPole-v1", num_envs=3)
    obs, _ = env.reset(seed=1)
    actions = policy.act(obs)
    assert actions.shape == (3,) and actions.dtype == np.int64 and set(actions) <= {0, 1}
    assert (sf_engine.load_policy(result.checkpoint).act(obs) == actions).all()  # a checkpoint file too

    from sf_engine.play.episodes import act
    from sf_engine.play.loading import load_experiment, load_policy

    cfg, spec, _ = load_experiment(str(tmp_path), "api")
    model = load_policy(cfg, spec, result.checkpoint, "cpu")
    greedy, _ = act(model, {"obs": __import__("torch").as_tensor(obs)}, deterministic=True)
    assert (greedy.numpy() == actions).all()

    with pytest.raises(ValueError, match=r"add the batch dimension, obs\[None\]"):
        policy.act(obs[0])
    with pytest.raises(ValueError, match=r"has shape \[3, 2\] where the policy takes \[batch, 4\]"):
        policy.act(obs[:, :2])
    with pytest.raises(sf_engine.LoadError, match="no such experiment directory or checkpoint file"):
        sf_engine.load_policy(str(tmp_path / "nothing"))


@pytest.mark.e2e
def test_an_observer_stops_the_run_and_one_that_raises_is_raised_after_the_stop(tmp_path, shm_dir):
    stopper = Recorder(stop_when=lambda figures: figures["env_steps"] >= 2_000)
    result = _train(tmp_path, shm_dir, experiment="stop", train_for_env_steps=10_000_000, observers=[stopper])
    assert result.stop_reason == "observer Recorder asked to stop"
    assert 2_000 <= result.summary["env_steps"] < 1_000_000

    class Broken:
        def on_report(self, figures):
            raise ZeroDivisionError("the user's bug")

    with pytest.raises(ZeroDivisionError, match="the user's bug"):
        _train(tmp_path, shm_dir, experiment="broken", train_for_env_steps=10_000_000, observers=[Broken()])
    summary = read_json(tmp_path / "broken" / "summary.json")  # the run stopped cleanly first
    assert summary["env_steps"] < 1_000_000 and os.listdir(shm_dir) == []


def test_a_bad_flag_is_train_pys_one_line_before_anything_on_disk_changes(tmp_path, capsys):
    (tmp_path / "keep").write_text("x")
    before = files_of(tmp_path)
    for flags, argv in (
        (dict(num_worker=2), ["--num_worker", "2"]),
        (dict(num_workers=-1), ["--num_workers", "-1"]),
        (dict(env="NoSuchEnv-v0"), ["--env", "NoSuchEnv-v0"]),
    ):
        with pytest.raises(sf_engine.ConfigError) as raised:
            sf_engine.train(train_dir=str(tmp_path), train_for_env_steps=1, **flags)
        assert f"error: {raised.value}" == train_error(argv, tmp_path, capsys)
        assert "\n" not in str(raised.value)
    assert files_of(tmp_path) == before


def test_keyword_values_become_flags_without_a_command_line():
    """train()'s keywords are the flags' values as they are (a bool, a number, a list), or read as the flag reads
    its text; an unknown one or a bad value is the command line's one line; config.json records the command line."""
    from sf_engine.config.cli import command_line_of, given_of_values

    given = given_of_values(
        dict(env="Pong-v5", with_vtrace=True, bf16="false", learning_rate=3e-4, seed=None, rollout="auto", gamma=1)
    )
    assert given["ppo"] == {"with_vtrace": True}
    assert given["run"]["bf16"] is False and given["learner"]["learning_rate"] == 3e-4
    assert given["sampler"]["rollout"] == "auto" and given["learner"]["gamma"] == 1.0
    assert isinstance(given["learner"]["gamma"], float) and "seed" not in given.get("env", {})
    from sf_engine.run.api import objects_as_flags

    assert objects_as_flags({"model": gym.Env, "seed": 3}) == {"model": "gymnasium.core:Env", "seed": 3}
    line = command_line_of(given)
    pairs = set(zip(line[::2], line[1::2]))
    assert {("--env", "Pong-v5"), ("--with_vtrace", "true"), ("--bf16", "false"), ("--rollout", "auto")} <= pairs
    for bad, words in (
        (dict(num_worker=2), "unknown flag --num_worker: did you mean --num_workers?"),
        (dict(mode="fast"), "--mode: invalid choice: 'fast'"),
        (dict(rollout="many"), "--rollout: expected an integer or 'auto', got 'many'"),
        (dict(num_workers=2.5), "--num_workers"),
    ):
        with pytest.raises(sf_engine.ConfigError, match=re.escape(words)):
            given_of_values(bad)


def small_encoder(observation_space):
    """A user's encoder factory, passed to train() as the object itself."""
    import torch

    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(observation_space.shape[0], 16), torch.nn.Tanh())


@pytest.mark.e2e
def test_train_takes_a_config_and_objects_without_a_command_line(tmp_path, shm_dir, monkeypatch):
    """A RunResult's config trains again with the same settings (the keywords win); an encoder factory and a spec
    are passed as themselves, registered under their names, and recorded in config.json."""
    import dataclasses

    from sf_engine.config import algorithms
    from sf_engine.config.algorithms import algorithm_spec
    from sf_engine.model import encoders

    monkeypatch.setattr(encoders, "_REGISTRY", dict(encoders._REGISTRY))
    monkeypatch.setattr(algorithms, "_REGISTERED", dict(algorithms._REGISTERED))
    where = dict(train_dir=str(tmp_path), shm_dir=shm_dir, env="CartPole-v1", **SMALL)
    first = sf_engine.train(
        **where, experiment="first", train_for_env_steps=2_000, hidden_size=32, encoder=small_encoder
    )
    config = first.config
    assert isinstance(config, sf_engine.Config) and config.model.hidden_size == 32
    assert config.model.encoder == "small_encoder" and config.learner.gamma == 0.99
    again = sf_engine.train(config, experiment="again", train_for_env_steps=3_000, gamma=0.98)
    saved = read_json(os.path.join(again.experiment_dir, "config.json"))
    assert saved["model"]["hidden_size"] == 32 and saved["model"]["encoder"] == "small_encoder"
    assert saved["learner"]["gamma"] == 0.98 and saved["run"]["train_for_env_steps"] == 3_000
    assert ("--gamma", "0.98") in zip(saved["command_line"][::2], saved["command_line"][1::2])
    assert again.summary["env_steps"] >= 3_000

    mine = dataclasses.replace(algorithm_spec("dqn"), description="DQN, a spec object of the user's")
    run = sf_engine.train(algo=mine, **where, experiment="spec", train_for_env_steps=1_500, learning_starts=256)
    assert read_json(os.path.join(run.experiment_dir, "config.json"))["learner"]["algo"] == (
        "sf_engine.algo.dqn.learning.DQN"
    )
    with pytest.raises(sf_engine.ConfigError, match="is no sf_engine.Config"):
        sf_engine.train({"env": "CartPole-v1"})
    other = dataclasses.replace(mine, description="another")
    with pytest.raises(sf_engine.ConfigError, match="its name 'sf_engine.algo.dqn.learning.DQN' is taken"):
        sf_engine.train(algo=other, **where, experiment="other", train_for_env_steps=1)


SCRIPT = """
import json, logging, multiprocessing.forkserver, os, sys
import psutil
import sf_engine

def twice():
    for restart in (True, True):
        result = sf_engine.train(
            env="CartPole-v1", mode="async", num_workers=1, num_envs_per_worker=8, rollout=32, batch_size=256,
            train_for_env_steps=5_000, train_dir=sys.argv[1], shm_dir=sys.argv[2], experiment="twice", restart=restart,
        )
        assert result.summary["env_steps"] >= 5_000, result
    server = multiprocessing.forkserver._forkserver
    print(json.dumps({
        "children": len(psutil.Process().children(recursive=True)),
        "forkserver": getattr(server, "_forkserver_pid", None),
        "handlers": len(logging.getLogger().handlers),
        "segments": os.listdir(sys.argv[2]),
    }))
"""


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["file", "stdin"])
def test_a_script_trains_twice_and_leaves_nothing_behind(tmp_path, shm_dir, how):
    script = SCRIPT + ('if __name__ == "__main__":\n    twice()\n' if how == "file" else "twice()\n")
    argv, stdin = [sys.executable], None
    if how == "file":
        (tmp_path / "sweep.py").write_text(script)
        argv.append("sweep.py")
    else:
        argv.append("-")
        stdin = script
    out = subprocess.run(
        argv + [str(tmp_path / "runs"), shm_dir], cwd=tmp_path, input=stdin, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    left = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert left == {"children": 0, "forkserver": None, "handlers": 0, "segments": []}


@pytest.mark.e2e
def test_a_script_without_the_main_guard_gets_one_line_saying_what_to_add(tmp_path):
    (tmp_path / "unguarded.py").write_text(
        textwrap.dedent(
            """
            import sf_engine
            sf_engine.train(train_dir="runs", train_for_env_steps=5_000, num_workers=1)
            """
        )
    )
    out = subprocess.run([sys.executable, "unguarded.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.count("Traceback") == 1 and len(out.stderr.splitlines()) < 15, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert 'unguarded.py without `if __name__ == "__main__":`' in last and "mode='serial'" in last
    assert not (tmp_path / "runs").exists()


def test_the_package_imports_no_training_machinery():
    code = "import sys, sf_engine; print(sorted(m for m in sys.modules if m.startswith(('sf_engine.run', 'torch'))))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _examples(doc: str) -> dict:
    """The complete scripts of a document: its python blocks whose first line names the file ('# name.py')."""
    import re

    with open(os.path.join(REPO, "docs", doc)) as f:
        blocks = re.findall(r"```python\n# (\w+\.py)\n(.*?)```", f.read(), re.S)
    return dict(blocks)


EXAMPLES = {**_examples("api.md"), "my_training.py": _examples("environments.md")["my_training.py"]}
EXPECTED = {
    "train_cartpole.py": "checkpoint_",
    "early_stop.py": "observer StopWhenSolved asked to stop",
    "optuna_study.py": "best: {'learning_rate':",
    "my_training.py": "checkpoint_",
}
DOC_MODULES = {"my_model.py": ["--model", "my_model:Trunk"]}  # modules the docs name in a command: trained with it


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_documented_scripts_run_as_written(tmp_path, name):
    assert set(EXAMPLES) == set(EXPECTED) | set(DOC_MODULES)
    (tmp_path / name).write_text(EXAMPLES[name])
    out = subprocess.run([sys.executable, name], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert EXPECTED[name] in out.stdout.strip().splitlines()[-1], out.stdout[-2000:]


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(DOC_MODULES))
def test_the_documented_modules_train_as_written(tmp_path, shm_dir, name):
    """A module of the docs (a user's whole network) in the user's directory, trained by the documented flags."""
    (tmp_path / name).write_text(EXAMPLES[name])
    flags = ["--env", "CartPole-v1", "--train_for_env_steps", "20000", "--num_workers", "1", "--shm_dir", shm_dir]
    where = ["--train_dir", str(tmp_path / "runs"), "--experiment", "doc"]
    cmd = [sys.executable, os.path.join(REPO, "train.py"), *DOC_MODULES[name], *flags, *where]
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert os.listdir(tmp_path / "runs" / "doc" / "checkpoints") and os.listdir(shm_dir) == []
