"""Algorithms as plug-ins: every built-in algorithm's spec is all the engine knows of it (no other module names
one), a user's algorithm registered from their own module trains, and `--algo module:SPEC` finds one."""

import ast
import glob
import os
import subprocess
import sys

import pytest
from conftest import REPO, read_json, train_error

import sf_engine
from sf_engine.config import algorithms
from sf_engine.config.algorithms import Range, algorithm_spec, built_in_algorithms

# A2C in one screen, against the public API (sf_engine's names: the batch it trains on, its result, its spec and
# data) and three building blocks that have no public name: GAE, the actor-critic it publishes, its flat weights;
# one step per batch
TOY = """
import torch

import sf_engine
from sf_engine.algo.targets import gae
from sf_engine.model.actor_critic import ActorCritic
from sf_engine.model.flat_state import flatten_state


class A2C:
    @staticmethod
    def acting_network(spec, cfg, bf16=False):
        return ActorCritic(spec, cfg.model)

    def __init__(self, cfg, spec, device, hooks):
        self.cfg = cfg
        self.model = ActorCritic(spec, cfg.model).to(device)
        self.params = flatten_state(self.model)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.learner.learning_rate)

    @property
    def learning_rate(self):
        return self.optimizer.param_groups[0]["lr"]

    def train(self, batch: sf_engine.TrajectoryBatch) -> sf_engine.TrainResult:
        steps, envs = batch.rewards.shape
        obs = {key: value.reshape(-1, *value.shape[2:]) for key, value in batch.obs.items()}
        params, values = self.model(obs)
        values = values.reshape(steps + 1, envs)
        advantages, returns = gae(
            batch.rewards, values.detach(), batch.terminated, batch.dones, batch.valid, self.cfg.learner.gamma, 0.95
        )
        acted = params.reshape(steps + 1, envs, -1)[:-1].reshape(steps * envs, -1)
        actions = batch.actions.reshape(steps * envs, *batch.actions.shape[2:])
        log_probs, entropy = self.model.log_prob_entropy(acted, actions)
        mask = batch.keep.reshape(-1).float()
        loss = -(log_probs * advantages.reshape(-1) + 0.01 * entropy) * mask
        loss = (loss + 0.5 * (values[:-1] - returns).square().reshape(-1) * mask).sum() / mask.sum()
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 0.5)
        self.optimizer.step()
        return sf_engine.TrainResult(int(mask.sum()), {"loss": loss.item()}, 1, 0)

    def state(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load(self, state, source):
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def weights_replaced(self):
        pass


SPEC = sf_engine.AlgorithmSpec(learner="toy_a2c:A2C", description="A2C, one step per batch", data=sf_engine.SLOTS)


class RankedA2C(A2C):  # data-parallel: each gradient replaced by its mean over the learner ranks before the step
    def join_ranks(self, group):
        for param in self.model.parameters():
            param.register_hook(group.average_)


RANKED = sf_engine.AlgorithmSpec(
    learner="toy_a2c:RankedA2C", description="A2C over learner ranks", data=sf_engine.SLOTS, data_parallel=True
)
NOT_RANKED = sf_engine.AlgorithmSpec(
    learner="toy_a2c:A2C", description="A2C that says data_parallel", data=sf_engine.SLOTS, data_parallel=True
)
"""


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    (tmp_path / "toy_a2c.py").write_text(TOY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(algorithms, "_REGISTERED", {})  # what the test registers goes with it
    yield tmp_path
    sys.modules.pop("toy_a2c", None)


@pytest.mark.e2e
def test_a_users_algorithm_registered_from_their_module_trains(user_dir, shm_dir):
    import toy_a2c  # the user's module, in the current directory (the fixture's)

    sf_engine.register_algorithm("a2c", toy_a2c.SPEC)
    result = sf_engine.train(
        algo="a2c",
        mode="serial",
        train_dir=str(user_dir / "runs"),
        shm_dir=shm_dir,
        train_for_env_steps=150_000,
        num_envs_per_worker=32,
        rollout=32,
        batch_size=1024,
        num_batches_per_epoch=1,
        learning_rate=3e-3,
    )
    assert result.summary["episode_return_mean"] > 60, result.summary  # a random policy's is about 22
    policy = sf_engine.load_policy(result.experiment_dir)
    assert policy.act(__import__("numpy").zeros((2, 4), "float32")).shape == (2,)


@pytest.mark.e2e
def test_a_users_data_parallel_algorithm_trains_with_two_learner_ranks(user_dir, shm_dir, capsys):
    """A user's algorithm whose spec says data_parallel and whose class has join_ranks(group) trains with two ranks:
    their weights are compared after every round (a difference would stop the run); one without join_ranks is
    refused in one line."""
    flags = ["--env", "CartPole-v1", "--num_learners", "2", "--mode", "sync", "--train_for_env_steps", "30000"]
    flags += ["--shm_dir", shm_dir, "--train_dir", str(user_dir / "runs"), "--experiment", "ranked"]
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "train.py"), "--algo", "toy_a2c:RANKED"] + flags,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_json(user_dir / "runs" / "ranked" / "summary.json")
    assert summary["learner_version"] > 5 and summary["algo"] == "toy_a2c:RANKED", summary
    assert "rank 1 of 2 on cpu" in (user_dir / "runs" / "ranked" / "train.log").read_text()
    error = train_error(["--algo", "toy_a2c:NOT_RANKED"] + flags, user_dir / "runs", capsys)
    assert "--num_learners 2: toy_a2c:A2C has no join_ranks(group)" in error, error
    error = train_error(["--algo", "toy_a2c:SPEC"] + flags, user_dir / "runs", capsys)  # its spec says nothing
    assert "--num_learners 2: --algo toy_a2c:SPEC does not average its gradients over learner ranks" in error, error


@pytest.mark.e2e
def test_algo_module_spec_on_the_command_line(user_dir, shm_dir):
    out = subprocess.run(
        [sys.executable, os.path.join(REPO, "train.py"), "--algo", "toy_a2c:SPEC", "--mode", "serial"]
        + ["--train_dir", "runs", "--shm_dir", shm_dir, "--train_for_env_steps", "5000", "--rollout", "32"],
        cwd=user_dir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert read_json(user_dir / "runs" / "default" / "config.json")["learner"]["algo"] == "toy_a2c:SPEC"


def test_a_bad_algo_is_one_line(tmp_path, capsys):
    line = train_error(["--algo", "a3c"], tmp_path, capsys)
    assert "--algo a3c: invalid choice, no such algorithm" in line
    assert all(name in line for name in built_in_algorithms())
    with pytest.raises(sf_engine.ConfigError, match="is a built-in algorithm"):
        sf_engine.register_algorithm("ppo", algorithm_spec("ppo"))


def test_every_spec_names_classes_that_exist_and_its_flags():
    from sf_engine.config.algorithms import import_class
    from sf_engine.config.groups import GROUPS

    for name, spec in built_in_algorithms().items():
        groups = list(GROUPS.values()) + ([spec.config[1]] if spec.config else [])  # every run's, and its own
        flags = {fld for cls in groups for fld in cls.__dataclass_fields__}
        learner = import_class(spec.learner)
        assert callable(getattr(learner, "acting_network", None)), name
        assert callable(getattr(learner, "train", None)), name  # the one training seam, whatever the data
        assert not hasattr(learner, "update"), name
        for family, defaults in spec.defaults.items():
            assert set(defaults) <= flags, (name, family, set(defaults) - flags)
        assert set(spec.pbt) <= flags and all(isinstance(r, Range) and r.low < r.high for r in spec.pbt.values()), name


# where an algorithm's name is a word of another flag, or --algo's default: --weight_init reads 'ppo', the former
# name of its 'scaled' orthogonal init (any algorithm's), from old command lines and saved configs
NOT_AN_ALGORITHM = {"weight_init", "algo"}


def _algorithm_names_in(path: str) -> list:
    """The string constants of a module that are an algorithm's name, outside the fields and comparisons of
    NOT_AN_ALGORITHM."""
    names = set(built_in_algorithms())
    with open(path) as f:
        tree = ast.parse(f.read())
    excluded = set()
    for node in ast.walk(tree):
        field = isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) in NOT_AN_ALGORITHM
        compared = isinstance(node, ast.Compare) and any(
            getattr(side, "attr", None) in NOT_AN_ALGORITHM - {"algo"} for side in [node.left, *node.comparators]
        )
        if field or compared:
            excluded |= {id(inner) for inner in ast.walk(node)}
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in excluded
    ]


def test_no_module_outside_an_algorithms_folder_names_an_algorithm():
    found = {}
    for path in glob.glob(os.path.join(REPO, "sf_engine", "**", "*.py"), recursive=True) + glob.glob(
        os.path.join(REPO, "envs", "*.py")
    ):
        relative = os.path.relpath(path, REPO)
        if relative.split(os.sep)[:2] == ["sf_engine", "algo"] and len(relative.split(os.sep)) > 3:
            continue  # an algorithm's own folder
        names = _algorithm_names_in(path)
        if names:
            found[relative] = names
    assert found == {}


# A replay transform of one's own, from the user's directory: one-step transitions cut from the buffer's raw steps
# alone (it keeps no array of its own), to show that a new kind of replayed data is no edit to the engine
ONE_STEP = """
from dataclasses import dataclass

import numpy as np

import sf_engine

CUT = []  # the samples cut, for the test to count


@dataclass
class Sample:
    obs: dict
    next_obs: dict
    actions: np.ndarray
    returns: np.ndarray
    discounts: np.ndarray
    weights: np.ndarray
    policy_version: np.ndarray
    indices: np.ndarray


class OneStep:
    steps_per_sample = 1

    def __init__(self, gamma):
        self.gamma = gamma

    @classmethod
    def from_config(cls, cfg):
        return cls(cfg.learner.gamma)

    @staticmethod
    def check(cfg):
        pass

    def arrays(self, columns, rollout, state):
        return {}

    def rows(self, rollout):
        return np.arange(rollout)

    def insert(self, arrays, columns, steps):
        return steps.valid.T

    def samplable(self, arrays, indices):
        return arrays["valid"].reshape(-1)[indices]

    def cut(self, arrays, obs, indices, weights):
        columns, rows = np.divmod(indices, arrays["valid"].shape[1])
        CUT.append(len(indices))
        return Sample(
            obs={key: array[columns, rows] for key, array in obs.items()},
            next_obs={key: array[columns, rows + 1] for key, array in obs.items()},
            actions=arrays["actions"][columns, rows],
            returns=arrays["rewards"][columns, rows],
            discounts=self.gamma * (1.0 - arrays["terminated"][columns, rows]).astype(np.float32),
            weights=weights.astype(np.float32),
            policy_version=arrays["policy_version"][columns, rows],
            indices=indices,
        )

    def batch(self, sample, tensor, discrete):
        return sf_engine.ReplayBatch(
            obs={key: tensor(value) for key, value in sample.obs.items()},
            actions=tensor(sample.actions.astype(np.int64).reshape(-1)),
            returns=tensor(sample.returns),
            discounts=tensor(sample.discounts),
            next_obs={key: tensor(value) for key, value in sample.next_obs.items()},
            weights=tensor(sample.weights),
        )
"""


@pytest.mark.e2e
def test_a_users_replay_transform_feeds_a_built_in_learner(user_dir, shm_dir):
    import dataclasses

    (user_dir / "one_step.py").write_text(ONE_STEP)
    import one_step

    sf_engine.register_algorithm("dqn1", dataclasses.replace(algorithm_spec("dqn"), data="one_step:OneStep"))
    result = sf_engine.train(
        algo="dqn1",
        env="CartPole-v1",
        mode="serial",
        train_dir=str(user_dir / "runs"),
        shm_dir=shm_dir,
        train_for_env_steps=40_000,
    )
    assert sum(one_step.CUT) >= 40_000 * 4, sum(one_step.CUT)  # --replay_ratio 8 less the learning starts
    assert result.summary["episode_return_mean"] > 60, result.summary  # a random policy's is about 22
    sys.modules.pop("one_step", None)


def test_a_spec_whose_data_is_no_replay_transform_is_one_line(user_dir, tmp_path, capsys):
    import dataclasses

    (user_dir / "not_a_transform.py").write_text("class Half:\n    def rows(self, rollout):\n        return []\n")
    sf_engine.register_algorithm("dqn_half", dataclasses.replace(algorithm_spec("dqn"), data="not_a_transform:Half"))
    line = train_error(["--algo", "dqn_half", "--env", "CartPole-v1"], tmp_path, capsys)
    assert "--algo dqn_half: its spec's data 'not_a_transform:Half' is no replay transform: it lacks" in line
    assert "from_config, check, arrays, insert, samplable, cut, batch" in line
    sys.modules.pop("not_a_transform", None)
