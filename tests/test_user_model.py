"""A user's whole PPO network (--model module:Class): what its class is given (the observation and action spaces
rebuilt from the env spec), the engine's parts around it (the action mask, the distribution, the normalizers), each
bad --model as one line before anything on disk changes; a serial run that learns CartPole with it, checkpoints it,
resumes it, and plays it through load_policy, enjoy.py and export; an async run whose processes find its module."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO, assert_refused_untouched, enjoy_episodes, read_json
from test_user_encoder import FAST, MY_ENCODER, _policy_state, _write

from sf_engine.config.groups import ModelConfig
from sf_engine.envs import probe_env_spec
from sf_engine.model.shape import resolve_model_config

# a whole network as a user writes it: a shared trunk under the policy and value heads, and an auxiliary head (a
# reconstruction of the observation) whose loss forward returns third: PPO adds it to its loss, so it trains too
# (`auxiliary_start` keeps its first weights, to tell)
MY_MODEL = """
import math

import torch
from torch import nn


class Trunk(nn.Module):
    def __init__(self, observation_space, action_space):
        super().__init__()
        size = math.prod(observation_space.shape)
        self.trunk = nn.Sequential(nn.Linear(size, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.policy = nn.Linear(64, int(action_space.n))
        self.value = nn.Linear(64, 1)
        self.auxiliary = nn.Linear(64, size)
        self.register_buffer("auxiliary_start", self.auxiliary.weight.detach().clone())

    def forward(self, obs):
        features = self.trunk(obs)
        reconstruction = (self.auxiliary(features) - obs).square().mean()
        return self.policy(features), self.value(features).squeeze(-1), 0.1 * reconstruction
"""
FLAGS = ["--model", "my_model:Trunk", "--rollout", "16", "--batch_size", "64", "--num_batches_per_epoch", "2"]


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A current directory holding my_model.py and my_encoder.py, forgotten afterwards."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "my_model.py").write_text(MY_MODEL)
    (work / "my_encoder.py").write_text(MY_ENCODER)
    monkeypatch.chdir(work)
    before = set(sys.modules)
    yield work
    for name in set(sys.modules) - before:
        if getattr(sys.modules[name], "__file__", None) and sys.modules[name].__file__.startswith(str(work)):
            del sys.modules[name]


def _network(spec, model: str, **flags):
    from sf_engine.algo.ppo.learning import PPO
    from sf_engine.config.groups import Config

    mcfg = resolve_model_config(ModelConfig(model=model, **flags), spec)
    return PPO.acting_network(spec, Config(model=mcfg))


SPACES_MODEL = """
class Spaces(nn.Module):
    \"\"\"Keeps the spaces it was given; zero logits (or means) and values of the right shapes.\"\"\"

    def __init__(self, observation_space, action_space):
        super().__init__()
        self.spaces = observation_space, action_space
        self.scale = nn.Parameter(torch.ones(()))
        if hasattr(action_space, "n"):
            self.size = int(action_space.n)
        else:
            self.size = int(sum(action_space.nvec)) if hasattr(action_space, "nvec") else action_space.shape[0]

    def forward(self, obs):
        rows = next(iter(obs.values())).shape[0] if isinstance(obs, dict) else obs.shape[0]
        return torch.zeros(rows, self.size) * self.scale, torch.zeros(rows) * self.scale
"""


def test_the_class_gets_both_spaces_and_the_engine_keeps_the_mask_distribution_and_normalizers(user_dir):
    """Discrete, MultiDiscrete and Box actions (a learned log-std beside the module); the observation space as a
    user's encoder gets it (the action mask left out); the mask applied to the module's logits; --normalize_input
    and --normalize_returns kept outside the module."""
    from gymnasium import spaces

    _write(user_dir, "spaces_model", SPACES_MODEL)
    masked = probe_env_spec("toy_envs:MaskedChoiceEnv", "auto")
    model = _network(masked, "spaces_model:Spaces", normalize_input=True, normalize_returns=True)
    observation, action = model.network.spaces
    assert list(observation.spaces) == ["obs"] and isinstance(action, spaces.Discrete) and action.n == 5
    mask = torch.tensor([[0, 1, 0, 1, 0]] * 64, dtype=torch.float32)
    actions, log_probs, values, state = model.sample({"obs": torch.zeros(64, 5), "action_mask": mask})
    assert set(actions.tolist()) <= {1, 3} and state is None and values.shape == (64,)
    assert torch.allclose(log_probs, torch.full((64,), float(np.log(0.5))))
    assert {"inputs.normalizers.obs.mean", "return_normalizer.mean", "network.scale"} <= set(model.state_dict())
    assert model.log_std is None and not model.recurrent and model.initial_state(3) is None

    toy = probe_env_spec("toy_envs:ToyDictEnv", "auto")
    model = _network(toy, "spaces_model:Spaces")
    assert list(model.network.spaces[1].nvec) == [3, 2] and set(model.network.spaces[0].spaces) == {"image", "vector"}
    obs = {"image": torch.zeros(4, 3, 8, 8, dtype=torch.uint8), "vector": torch.zeros(4, 2)}
    assert model.sample(obs)[0].shape == (4, 2)

    pendulum = probe_env_spec("Pendulum-v1", "auto")
    model = _network(pendulum, "spaces_model:Spaces")
    assert isinstance(model.network.spaces[1], spaces.Box) and model.log_std.shape == (1,)
    action, value = model.greedy({"obs": torch.zeros(2, 3)})
    assert action.shape == (2, 1) and value.shape == (2,)


@pytest.mark.e2e
def test_a_serial_run_learns_cartpole_and_plays_through_load_policy_enjoy_and_export(
    user_dir, tmp_path, shm_dir, capsys
):
    """The budget is in env steps: a slower machine takes longer, never fewer samples."""
    import sf_engine
    from sf_engine.play.export import main as export_main
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    where = ["--train_dir", str(tmp_path / "train"), "--experiment", "whole", "--shm_dir", shm_dir]
    # trained on to 250 (its last greedy episodes are played below: a policy just past 150 may still act badly greedily)
    budget = ["--stop_at_return", "250", "--train_for_env_steps", "500000", "--num_envs_per_worker", "16"]
    plan = build_plan(FLAGS + FAST + budget + where)
    assert any(n.startswith("--model my_model:Trunk: a user's whole network (") for n in plan.notes), plan.notes
    assert plan.cfg.model.encoder == "auto"
    assert run(plan) == 0
    summary = read_json(tmp_path / "train" / "whole" / "summary.json")
    assert summary["episode_return_mean"] > 100, summary  # a random policy averages about 22
    assert summary["updates_skipped_non_finite"] == 0 and os.listdir(shm_dir) == []
    state = _policy_state(tmp_path / "train" / "whole")["model"]
    assert "network.auxiliary.weight" in state and not any(key.startswith("actor_encoder") for key in state)
    assert not torch.equal(state["network.auxiliary.weight"], state["network.auxiliary_start"])  # its loss trained it

    policy = sf_engine.load_policy(str(tmp_path / "train" / "whole"))
    actions = policy.act(np.zeros((3, 4), np.float32))
    assert actions.shape == (3,) and set(actions.tolist()) <= {0, 1}
    capsys.readouterr()
    episodes = enjoy_episodes(capsys, *where[:4], "--deterministic")
    assert len(episodes) == 2 and min(float(ret) for ret, _ in episodes) > 50, episodes
    assert export_main(where[:4]) == 0
    assert {"policy.onnx", "policy.torchscript.pt"} <= set(os.listdir(tmp_path / "train" / "whole" / "export"))


# a network that the ONNX exporter has no function for (an eigenvalue), which TorchScript traces
EIGH_MODEL = """
class Net(nn.Module):
    def __init__(self, observation_space, action_space):
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, obs):
        out = self.linear(obs)
        spread = torch.linalg.eigvalsh(obs[:, :2, None] * obs[:, None, :2])[:, -1]
        return out[:, :2], out[:, 2] + spread
"""


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
def test_an_export_the_exporter_cannot_make_is_one_line_and_the_other_format_is_written(user_dir, tmp_path):
    from sf_engine.play.export import export
    from sf_engine.play.loading import LoadError

    _write(user_dir, "eigh_model", EIGH_MODEL)
    spec = probe_env_spec("CartPole-v1", "auto")
    model = _network(spec, "eigh_model:Net")
    with pytest.raises(LoadError) as failed:
        export(model, spec, str(tmp_path / "export"))
    message = str(failed.value)
    assert message.startswith("the ONNX export failed (") and "aten._linalg_eigh" in message, message
    assert "\n" not in message and "--format torchscript writes the other file alone" in message
    assert export(model, spec, str(tmp_path / "export"), "torchscript")[0].endswith("policy.torchscript.pt")


@pytest.mark.e2e
def test_a_resumed_run_rebuilds_the_network_and_an_edited_module_is_one_line(user_dir, tmp_path, shm_dir, capsys):
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    where = ["--train_dir", str(tmp_path / "train"), "--experiment", "resume", "--shm_dir", shm_dir]
    assert run(build_plan(FLAGS + FAST + where + ["--train_for_env_steps", "1000"])) == 0
    first = _policy_state(tmp_path / "train" / "resume")["model"]["network.trunk.0.weight"]
    resumed = build_plan(FLAGS + FAST + where + ["--train_for_env_steps", "2000"])
    assert resumed.resume_from is not None and run(resumed) == 0
    assert not torch.equal(first, _policy_state(tmp_path / "train" / "resume")["model"]["network.trunk.0.weight"])

    (user_dir / "my_model.py").write_text(MY_MODEL.replace("(size, 64)", "(size, 32)").replace("(64, 64)", "(32, 64)"))
    del sys.modules["my_model"]
    words = ["--model my_model:Trunk: its module is not the one of the checkpoint", "[64, 4] in it, [32, 4] now"]
    again = FLAGS + FAST + ["--experiment", "resume", "--shm_dir", shm_dir, "--train_for_env_steps", "4000"]
    assert_refused_untouched(again, tmp_path / "train", capsys, words)


@pytest.mark.e2e
def test_an_async_run_finds_the_module_in_every_process(user_dir, tmp_path, shm_dir):
    flags = FLAGS + ["--num_workers", "2", "--num_envs_per_worker", "8", "--device", "cpu"]
    flags += ["--train_for_env_steps", "4000", "--train_dir", str(tmp_path / "train"), "--experiment", "async"]
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "train.py")] + flags + ["--shm_dir", shm_dir],
        cwd=user_dir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_json(tmp_path / "train" / "async" / "summary.json")
    assert summary["mode"] == "async" and summary["learner_version"] > 0, summary
    assert "network.auxiliary.weight" in _policy_state(tmp_path / "train" / "async")["model"]
    assert os.listdir(shm_dir) == []


BAD_MODULES = {
    "model_raises": "class Net(nn.Module):\n    def __init__(self, observation_space, action_space):\n"
    "        raise ValueError('no such layer')\n",
    "model_one_space": "class Net(nn.Module):\n    def __init__(self, observation_space):\n        pass\n",
    "model_not_module": "def Net(observation_space, action_space):\n    return [nn.Linear(4, 2)]\n",
    "model_one_output": "def Net(observation_space, action_space):\n    return nn.Linear(4, 2)\n",
    "model_value_column": "class Net(nn.Module):\n    def __init__(self, observation_space, action_space):\n"
    "        super().__init__()\n        self.linear = nn.Linear(4, 3)\n\n"
    "    def forward(self, obs):\n        out = self.linear(obs)\n        return out[:, :2], out[:, 2:]\n",
    "model_constant": "Net = 3\n",
}


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--algo", "dqn"], ["--model is PPO's (--algo ppo): drop it with --algo dqn"]),
        (["--encoder", "my_encoder:make"], ["--model my_model:Trunk replaces the encoder", "drop --encoder"]),
        (["--encoder", "mlp"], ["--model my_model:Trunk replaces the encoder", "drop --encoder mlp"]),
        (["--rnn", "gru"], ["--model my_model:Trunk is a feed-forward network", "drop --rnn gru"]),
        (["--model", "missing_module:Net"], ["--model missing_module:Net: cannot import module 'missing_module'"]),
        (["--model", "my_model:Trunc"], ["--model my_model:Trunc", "has no 'Trunc'", "did you mean my_model:Trunk?"]),
        (["--model", "model_constant:Net"], ["--model model_constant:Net", "is a int, not a class"]),
        (["--model", "model_raises:Net"], ["Net(observation_space, action_space) raised ValueError: no such layer"]),
        (["--model", "model_one_space:Net"], ["Net(observation_space, action_space) raised TypeError"]),
        (["--model", "model_not_module:Net"], ["returned a list, not a torch.nn.Module"]),
        (["--model", "model_one_output:Net"], ["returned a Tensor for a batch of 2", "obs [2, 4]", "logits [B, 2]"]),
        (
            ["--model", "model_value_column:Net"],
            ["returned (a torch.float32 tensor [2, 2], a torch.float32 tensor [2, 1])"],
        ),
    ],
)
def test_a_bad_model_is_one_line_naming_the_flag_and_touches_nothing(user_dir, tmp_path, capsys, flags, words):
    for name, source in BAD_MODULES.items():
        _write(user_dir, name, source)
    (tmp_path / "train").mkdir()
    assert_refused_untouched(["--model", "my_model:Trunk"] + flags, tmp_path / "train", capsys, words)


def test_an_env_familys_encoder_and_core_are_not_the_defaults_of_a_whole_network(user_dir, monkeypatch):
    """Doom's family sets --encoder convnet_simple and --rnn gru for the built-in networks: a run with --model
    takes neither (the spec's family is all that counts here, so CartPole stands in for Doom)."""
    from sf_engine.model.user_model import BUILT_IN_NETWORK_FLAGS
    from sf_engine.run import plan as plan_module

    given = {"model": {"model": "my_model:Trunk"}}
    defaults = {"encoder": "convnet_simple", "rnn": "gru", "hidden_size": 32}
    monkeypatch.setattr(plan_module, "flag_defaults", lambda spec: defaults)
    cfg, _ = plan_module._configured(given, {})
    assert (cfg.model.encoder, cfg.model.rnn, cfg.model.hidden_size) == ("auto", "none", 32)
    assert set(BUILT_IN_NETWORK_FLAGS) == {"encoder", "rnn"}
