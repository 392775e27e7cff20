"""Every algorithm's flags in a group of its own, registered the same way for the built-in algorithms and a user's:
the group is a run's only where that algorithm learns (cfg.<its name>), a flag of another algorithm's group is one
line naming its owner, and a user's algorithm from a module in the current directory gets its flags on the command
line, in config.json, from --config, through sf_engine.train(its_flag=...) and in the learner's process."""

import os
import subprocess
import sys

import pytest
from conftest import REPO, read_json

import sf_engine
from sf_engine.config import algorithms
from sf_engine.config.cli import build_parser, make_config, parse_flags
from sf_engine.config.groups import GROUPS, Config, ConfigError, LearnerConfig

# REINFORCE with a learned baseline, its own flag group (`toy`: --toy_entropy_coeff), reporting the value it trains
# with as a loss statistic so that the test sees what the learner's process read
TOY = """
from dataclasses import dataclass

import torch

import sf_engine
from sf_engine.algo.base import TrainResult
from sf_engine.model.actor_critic import ActorCritic
from sf_engine.model.flat_state import flatten_state


@dataclass(frozen=True)
class ToyConfig:
    toy_entropy_coeff: float = sf_engine.flag_field(0.01, "The toy's entropy bonus.")
    toy_baseline: bool = sf_engine.flag_field(True, "The toy subtracts its value estimate from the returns.")


def check(cfg):
    if cfg.toy.toy_entropy_coeff < 0:
        raise sf_engine.ConfigError(f"--toy_entropy_coeff must be >= 0 (got {cfg.toy.toy_entropy_coeff})")


class Toy:
    @staticmethod
    def acting_network(spec, cfg, bf16=False):
        return ActorCritic(spec, cfg.model)

    def __init__(self, cfg, spec, device, hooks):
        self.cfg, self.toy = cfg, cfg.toy
        self.model = ActorCritic(spec, cfg.model).to(device)
        self.params = flatten_state(self.model)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.learner.learning_rate)

    @property
    def learning_rate(self):
        return self.optimizer.param_groups[0]["lr"]

    def train(self, batch):
        steps, envs = batch.rewards.shape
        obs = {key: value[:-1].reshape(steps * envs, *value.shape[2:]) for key, value in batch.obs.items()}
        params, values = self.model(obs)
        returns = batch.rewards.flip(0).cumsum(0).flip(0).reshape(-1)
        advantages = returns - values.detach() if self.toy.toy_baseline else returns
        log_probs, entropy = self.model.log_prob_entropy(params, batch.actions.reshape(steps * envs, -1)[:, 0])
        mask = batch.keep.reshape(-1).float()
        loss = -(log_probs * advantages + self.toy.toy_entropy_coeff * entropy) + (values - returns).square()
        loss = (loss * mask).sum() / mask.sum().clamp(min=1)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return TrainResult(int(mask.sum()), {"toy_entropy_coeff": self.toy.toy_entropy_coeff}, 1, 0)

    def state(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load(self, state, source):
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def weights_replaced(self):
        pass


SPEC = sf_engine.AlgorithmSpec(
    learner="toy_flags:Toy", description="REINFORCE with a baseline", config=("toy", ToyConfig), check=check
)
"""


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    (tmp_path / "toy_flags.py").write_text(TOY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(algorithms, "_FROM_MODULES", {})  # each test imports the module anew, as a new process would
    yield tmp_path
    sys.modules.pop("toy_flags", None)


def test_a_built_in_algorithms_group_is_its_runs_only():
    sac = make_config(parse_flags(["--algo", "sac", "--alpha", "0.3"]))
    assert sac.sac.alpha == 0.3 and sac.to_dict()["sac"]["alpha"] == 0.3
    assert "td3" not in sac.to_dict() and Config.from_dict(sac.to_dict()) == sac
    ppo = make_config(parse_flags(["--entropy_coeff", "0.01"]))
    assert set(ppo.to_dict()) == set(GROUPS) | {"ppo"} and ppo.ppo.entropy_coeff == 0.01
    assert set(make_config(parse_flags(["--algo", "dqn"])).to_dict()) == set(GROUPS)  # DQN has no group of its own
    with pytest.raises(AttributeError, match="no group 'sac'"):
        ppo.sac
    assert Config(learner=LearnerConfig(algo="td3")).td3.policy_delay == 2  # its defaults where none is given


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--alpha", "0.3"], "--alpha is --algo sac's flag: drop it with --algo ppo, or use --algo sac"),
        (  # a flag two algorithms' groups share names both
            ["--algo", "dqn", "--policy_delay", "3"],
            "--policy_delay is --algo crossq or --algo td3's flag: drop it with --algo dqn, or use --algo crossq or",
        ),
        (["--algo", "sac", "--with_vtrace", "true"], "--with_vtrace is --algo ppo's flag: drop it with --algo sac"),
    ],
)
def test_a_flag_of_another_algorithms_group_is_one_line_naming_its_owner(argv, line):
    with pytest.raises(ConfigError, match=line.replace("-", r"\-")):
        make_config(parse_flags(argv))


def test_a_saved_config_of_another_algorithm_leaves_its_group_out(tmp_path):
    """config.json of a SAC run (or of an earlier version, which held every group) read for a PPO run."""
    sac = make_config(parse_flags(["--algo", "sac", "--alpha", "0.3"])).to_dict()
    old = tmp_path / "config.json"
    old.write_text(__import__("json").dumps(sac | {"td3": {"policy_delay": 3}}))
    given = parse_flags(["--config", str(old), "--algo", "ppo"])
    from sf_engine.run.plan import saved_config

    cfg = make_config(given, saved=saved_config(given))
    assert cfg.learner.algo == "ppo" and cfg.algo_group == cfg.algorithm.config[1]()
    given = parse_flags(["--config", str(old)])  # the file's own --algo, and its group
    assert make_config(given, saved=saved_config(given)).sac.alpha == 0.3


def test_a_users_group_is_on_the_command_line_and_in_help(user_dir):
    cfg = make_config(
        parse_flags(["--algo", "toy_flags:SPEC", "--toy_entropy_coeff", "0.2", "--toy_baseline", "false"])
    )
    assert (cfg.toy.toy_entropy_coeff, cfg.toy.toy_baseline) == (0.2, False)
    assert Config.from_dict(cfg.to_dict()) == cfg
    assert "--toy_entropy_coeff" in build_parser("toy_flags:SPEC").format_help()
    assert "--toy_entropy_coeff" not in build_parser().format_help()
    with pytest.raises(ConfigError, match="unknown flag --toy_entropy_coeff"):
        parse_flags(["--toy_entropy_coeff", "0.2"])  # without its --algo, no such flag
    from sf_engine.config.checks import check_flags

    with pytest.raises(ConfigError, match="--toy_entropy_coeff must be >= 0"):
        check_flags(make_config(parse_flags(["--algo", "toy_flags:SPEC", "--toy_entropy_coeff", "-1"])))


class Seen:
    """What the learner trained with, as its loss statistic says."""

    def __init__(self):
        self.values = set()

    def on_report(self, figures):
        if "train/toy_entropy_coeff" in figures.scalars:
            self.values.add(figures.scalars["train/toy_entropy_coeff"])


def _train(user_dir, shm_dir, seen, **flags):
    return sf_engine.train(
        algo="toy_flags:SPEC",
        mode="async",
        num_workers=1,
        num_envs_per_worker=8,
        rollout=16,
        batch_size=128,
        num_batches_per_epoch=1,
        train_dir=str(user_dir / "runs"),
        shm_dir=shm_dir,
        observers=[seen],
        **flags,
    )


@pytest.mark.e2e
def test_a_users_flag_reaches_the_learner_and_config_json_and_is_resumed(user_dir, shm_dir):
    seen = Seen()
    result = _train(user_dir, shm_dir, seen, toy_entropy_coeff=0.25, train_for_env_steps=4000)
    assert seen.values == {0.25}
    saved = read_json(os.path.join(result.experiment_dir, "config.json"))
    assert saved["toy"] == {"toy_entropy_coeff": 0.25, "toy_baseline": True}
    # the same experiment, a longer budget, another value: resumed from its checkpoint. The budget is checked
    # every quarter second, so a fast first run may pass 4,000 by thousands: the new one starts past its end
    longer = result.summary["env_steps"] + 4000
    resumed = Seen()
    _train(user_dir, shm_dir, resumed, toy_entropy_coeff=0.5, train_for_env_steps=longer)
    assert resumed.values == {0.5}
    log = open(os.path.join(result.experiment_dir, "train.log")).read()
    changed = f"--train_for_env_steps 4000 -> {longer}, --toy_entropy_coeff 0.25 -> 0.5"
    assert f"resuming with changed flags: {changed}" in log
    out = subprocess.run(  # the saved config.json as --config of a new experiment, on the command line
        [sys.executable, os.path.join(REPO, "train.py"), "--config", os.path.join(result.experiment_dir, "config.json")]
        + [
            "--train_dir",
            "runs",
            "--experiment",
            "again",
            "--train_for_env_steps",
            "2000",
            "--mode",
            "serial",
            "--shm_dir",
            shm_dir,
        ],
        cwd=user_dir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert read_json(user_dir / "runs" / "again" / "config.json")["toy"]["toy_entropy_coeff"] == 0.5
