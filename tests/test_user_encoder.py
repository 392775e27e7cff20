"""A user's own encoder (--encoder module:callable, or a name given to register_encoder): what its module is given
(the observation space rebuilt from the env spec, float tensors shaped as the env gives them, never the action
mask), each bad --encoder as one line before anything on disk changes, its weights in every algorithm's model and
in export's files; runs of PPO, DQN, PQN, R2D2 and SAC in serial mode and of PPO in async mode that train it and
checkpoint it, enjoy.py on the result. Also the built-in encoders' registry."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO, assert_refused_untouched, enjoy_episodes, read_json

from sf_engine.config.groups import ConfigError, ModelConfig
from sf_engine.envs import probe_env_spec
from sf_engine.model import encoders
from sf_engine.model.shape import resolve_model_config

# a user's encoder as a user writes it: every entry flattened side by side, one linear layer of 32 units, tanh
MY_ENCODER = """
import math

import torch
from torch import nn


class Flat(nn.Module):
    def __init__(self, observation_space):
        super().__init__()
        self.spaces = dict(getattr(observation_space, "spaces", {"obs": observation_space}))
        self.is_dict = hasattr(observation_space, "spaces")
        self.linear = nn.Linear(sum(math.prod(space.shape) for space in self.spaces.values()), 32)

    def forward(self, obs):
        parts = [obs[key] for key in self.spaces] if self.is_dict else [obs]
        return torch.tanh(self.linear(torch.cat([part.flatten(1) for part in parts], dim=1)))


def make(observation_space):
    return Flat(observation_space)
"""
FAST = ["--mode", "serial", "--num_workers", "1", "--num_envs_per_worker", "8", "--device", "cpu", "--seed", "1"]
ALGO_FLAGS = {
    "ppo": ["--rollout", "16", "--batch_size", "64", "--num_batches_per_epoch", "2", "--train_for_env_steps", "2000"],
    "dqn": ["--learning_starts", "256", "--train_for_env_steps", "1500"],
    "pqn": ["--rollout", "16", "--batch_size", "64", "--train_for_env_steps", "2000"],
    "r2d2": ["--rnn", "gru", "--rollout", "16", "--burn_in", "4", "--replay_sequence_length", "8"]
    + ["--learning_starts", "500", "--train_for_env_steps", "1500"],
    "sac": ["--env", "Pendulum-v1", "--learning_starts", "300", "--replay_ratio", "4", "--batch_size", "64"]
    + ["--train_for_env_steps", "1000"],
    "crossq": ["--env", "Pendulum-v1", "--learning_starts", "300", "--replay_ratio", "4", "--batch_size", "64"]
    + ["--critic_hidden_size", "32", "--train_for_env_steps", "1000"],
}


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A current directory holding my_encoder.py (and the modules a test writes there), forgotten afterwards."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "my_encoder.py").write_text(MY_ENCODER)
    monkeypatch.chdir(work)
    before = set(sys.modules)
    yield work
    for name in set(sys.modules) - before:
        if getattr(sys.modules[name], "__file__", None) and sys.modules[name].__file__.startswith(str(work)):
            del sys.modules[name]


@pytest.fixture
def registry(monkeypatch):
    """register_encoder's registrations undone after the test."""
    monkeypatch.setattr(encoders, "_REGISTRY", dict(encoders._REGISTRY))


def _model_config(encoder: str, spec, **flags):
    return resolve_model_config(ModelConfig(encoder=encoder, **flags), spec)


class Recorder(torch.nn.Module):
    """A user's module that keeps what it was given (the space, the last inputs) and returns 3 features."""

    def __init__(self, observation_space):
        super().__init__()
        self.space, self.seen = observation_space, None
        self.scale = torch.nn.Parameter(torch.ones(3))

    def forward(self, obs):
        self.seen = obs
        first = next(iter(obs.values())) if isinstance(obs, dict) else obs
        return first.flatten(1)[:, :1] * self.scale


def test_the_module_gets_the_rebuilt_space_and_float_tensors_shaped_as_the_env_gives_them(registry):
    """A Dict env: a Dict space, and per entry a float tensor [B, *shape] (its uint8 image scaled to [0, 1], [C, H, W]
    as the env gives it); an [H, W, C] image stays [H, W, C]; the action mask is in neither the space nor the
    inputs."""
    from gymnasium import spaces

    from sf_engine.model.actor_critic import ActorCritic

    encoders.register_encoder("recorder", Recorder)
    spec = probe_env_spec("toy_envs:ToyDictEnv", "auto")
    model = ActorCritic(spec, _model_config("recorder", spec))
    user = model.actor_encoder.user
    assert isinstance(user.space, spaces.Dict) and set(user.space.spaces) == {"image", "vector"}
    assert user.space["image"].dtype == np.uint8 and user.space["image"].shape == (3, 8, 8)
    obs = {"image": torch.full((5, 3, 8, 8), 51, dtype=torch.uint8), "vector": torch.ones(5, 2)}
    params, values = model(obs)
    assert params.shape == (5, 5) and values.shape == (5,)
    assert user.seen["image"].dtype == torch.float32 and user.seen["image"].shape == (5, 3, 8, 8)
    assert user.seen["image"].is_contiguous()
    assert torch.allclose(user.seen["image"], torch.full((5, 3, 8, 8), 0.2)) and user.seen["vector"].shape == (5, 2)

    hwc = probe_env_spec("toy_envs:ToyHWCImageEnv", "auto")
    model = ActorCritic(hwc, _model_config("recorder", hwc))
    assert isinstance(model.actor_encoder.user.space, spaces.Box)
    model({"obs": torch.full((2, 7, 7, 3), 255, dtype=torch.uint8)})
    assert model.actor_encoder.user.seen.shape == (2, 7, 7, 3) and bool((model.actor_encoder.user.seen == 1).all())

    masked = probe_env_spec("toy_envs:MaskedChoiceEnv", "auto")
    model = ActorCritic(masked, _model_config("recorder", masked))
    assert list(model.actor_encoder.user.space.spaces) == ["obs"]
    model({"obs": torch.zeros(2, 5), "action_mask": torch.ones(2, 5)})
    assert list(model.actor_encoder.user.seen) == ["obs"]


def test_register_encoder_refuses_names_it_cannot_hold_and_lists_what_it_holds(registry):
    for name in ("", "auto", "mlp", "nature_cnn", "my:make", 3):
        with pytest.raises(ValueError, match="cannot name an encoder"):
            encoders.register_encoder(name, Recorder)
    with pytest.raises(ValueError, match="not callable"):
        encoders.register_encoder("mine", 3)
    encoders.register_encoder("mine", Recorder)
    assert encoders.registered_encoders() == {"mine": Recorder}  # the built-in ones are not the user's
    assert encoders.user_registration("mine") == ((encoders.register_encoder, "mine", Recorder),)
    assert encoders.user_registration("impala_cnn") == () and encoders.is_builtin("impala_cnn")
    assert not encoders.is_builtin("mine") and not encoders.is_builtin("my_encoder:make")


def test_every_algorithms_model_holds_the_users_module_and_its_features(user_dir):
    """PPO's actor and critic (separate: one each), the Q-network under its core, SAC's actor and each critic."""
    from sf_engine.config.value import QConfig
    from sf_engine.model.actor_critic import ActorCritic
    from sf_engine.model.q_network import QNetwork
    from sf_engine.model.sac_networks import SACActor, TwinCritic

    cartpole = probe_env_spec("CartPole-v1", "auto")
    mcfg = _model_config("my_encoder:make", cartpole, actor_critic="separate")
    model = ActorCritic(cartpole, mcfg)
    assert model.actor_encoder.out_size == 32 and model.actor_encoder.user is not model.critic_encoder.user
    assert model.policy_head.in_features == 32 and model.direct_gradients({"obs": torch.zeros(4, 4)}) is False
    assert {"actor_encoder.user.linear.weight", "critic_encoder.user.linear.weight"} <= set(model.state_dict())
    recurrent = QNetwork(cartpole, _model_config("my_encoder:make", cartpole, rnn="gru"), QConfig())
    assert recurrent.core.rnn.input_size == 32 and "encoder.user.linear.weight" in recurrent.state_dict()
    q, values, state = recurrent({"obs": torch.zeros(3, 4)}, recurrent.initial_state(3))
    assert q.shape == (3, 2) and state.shape == (3, recurrent.state_size)
    pendulum = probe_env_spec("Pendulum-v1", "auto")
    actor, critic = SACActor(pendulum, _model_config("my_encoder:make", pendulum)), None
    critic = TwinCritic(pendulum, _model_config("my_encoder:make", pendulum))
    assert actor.net.layers[0].in_features == 32 and "encoder.user.linear.weight" in actor.state_dict()
    assert {"encoders.0.user.linear.weight", "encoders.1.user.linear.weight"} <= set(critic.state_dict())
    q1, q2 = critic(actor.inputs({"obs": torch.zeros(6, 3)}), torch.zeros(6, 1))
    assert q1.shape == q2.shape == (6,)


def test_weight_init_unit_leaves_the_users_module_as_its_factory_made_it(user_dir):
    from sf_engine.model.actor_critic import ActorCritic

    cartpole = probe_env_spec("CartPole-v1", "auto")
    torch.manual_seed(0)
    made = encoders.user_network("my_encoder:make", cartpole)[0].linear.weight.detach().clone()
    torch.manual_seed(0)
    model = ActorCritic(cartpole, _model_config("my_encoder:make", cartpole, weight_init="unit"))
    assert torch.equal(model.actor_encoder.user.linear.weight, made)


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_export_runs_the_users_module_in_both_files(user_dir, tmp_path):
    import onnxruntime

    from sf_engine.model.actor_critic import ActorCritic
    from sf_engine.play.export import export

    spec = probe_env_spec("toy_envs:ToyDictEnv", "auto")
    torch.manual_seed(0)
    model = ActorCritic(spec, _model_config("my_encoder:make", spec, normalize_input=True)).eval()
    rng = np.random.default_rng(0)
    obs = {"image": rng.integers(0, 256, (16, 3, 8, 8), dtype=np.uint8), "vector": rng.normal(size=(16, 2))}
    obs["vector"] = obs["vector"].astype(np.float32)
    with torch.no_grad():
        expected = model.greedy({key: torch.from_numpy(value) for key, value in obs.items()})[0].numpy()
    export(model, spec, str(tmp_path / "export"))
    onnx_action = onnxruntime.InferenceSession(str(tmp_path / "export" / "policy.onnx")).run(None, obs)[0]
    script = torch.jit.load(str(tmp_path / "export" / "policy.torchscript.pt"))
    with torch.no_grad():
        script_action = script(torch.from_numpy(obs["image"]), torch.from_numpy(obs["vector"]))[0].numpy()
    assert (onnx_action == expected).all() and (script_action == expected).all()


def _write(directory, name: str, source: str) -> None:
    (directory / f"{name}.py").write_text("import torch\nfrom torch import nn\n\n" + source)


BAD_MODULES = {
    "enc_not_callable": "make = 3\n",
    "enc_raises": "def make(observation_space):\n    raise ValueError('no such layer')\n",
    "enc_not_module": "def make(observation_space):\n    return [nn.Linear(4, 8)]\n",
    "enc_fails": "def make(observation_space):\n    return nn.Linear(5, 8)\n",
    "enc_3d": "def make(observation_space):\n    return nn.Unflatten(1, (2, 2))\n",
    "enc_forward": "class Wrong(nn.Module):\n    def forward(self, x):\n        return x @ torch.ones(5, 8)\n\n\n"
    "def make(observation_space):\n    return Wrong()\n",
    "enc_ints": "class Ints(nn.Module):\n    def forward(self, x):\n        return x.long()\n\n\n"
    "def make(observation_space):\n    return Ints()\n",
}


@pytest.mark.parametrize(
    "encoder, words",
    [
        ("nosuch", ["--encoder nosuch: no encoder of that name", "impala_cnn", "module:callable", "register_encoder"]),
        ("impala", ["--encoder impala", "did you mean impala_cnn?"]),
        ("missing_module:make", ["--encoder missing_module:make", "cannot import module 'missing_module'"]),
        ("my_encoder:maek", ["--encoder my_encoder:maek", "has no 'maek'", "did you mean my_encoder:make?"]),
        ("enc_not_callable:make", ["--encoder enc_not_callable:make", "not callable"]),
        ("enc_raises:make", ["--encoder enc_raises:make: make(observation_space) raised ValueError: no such layer"]),
        ("enc_not_module:make", ["--encoder enc_not_module:make", "returned a list, not a torch.nn.Module"]),
        ("enc_fails:make", ["--encoder enc_fails:make: its module failed on a sample batch", "obs [2, 4]"]),
        ("enc_forward:make", ["its module failed", "RuntimeError", "(enc_forward.py:6)"]),
        ("enc_3d:make", ["--encoder enc_3d:make", "tensor [2, 2, 2]", "features [B, F]"]),
        ("enc_ints:make", ["--encoder enc_ints:make", "torch.int64", "of floats"]),
    ],
)
def test_a_bad_encoder_is_one_line_naming_the_flag_and_touches_nothing(user_dir, tmp_path, capsys, encoder, words):
    for name, source in BAD_MODULES.items():
        _write(user_dir, name, source)
    (tmp_path / "train").mkdir()
    assert_refused_untouched(["--encoder", encoder], tmp_path / "train", capsys, words)


def test_a_registered_factory_that_cannot_reach_the_processes_is_one_line(registry, tmp_path, capsys):
    encoders.register_encoder("closure", lambda space: Recorder(space))
    words = ["--encoder closure", "cannot be sent", "module-level function"]
    (tmp_path / "train").mkdir()
    assert_refused_untouched(["--encoder", "closure", "--mode", "async"], tmp_path / "train", capsys, words)


def _policy_state(experiment_dir) -> dict:
    from sf_engine.runtime.checkpoint import latest_checkpoint, load_checkpoint, policy_states

    return policy_states(load_checkpoint(latest_checkpoint(os.path.join(experiment_dir, "checkpoints"))))[0]


@pytest.mark.e2e
@pytest.mark.parametrize("algo", ["ppo", "dqn", "pqn", "r2d2", "sac", "crossq"])
def test_a_serial_run_trains_and_checkpoints_the_users_module(user_dir, tmp_path, shm_dir, algo):
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    where = ["--train_dir", str(tmp_path / "train"), "--experiment", algo, "--shm_dir", shm_dir]
    plan = build_plan(["--algo", algo, "--encoder", "my_encoder:make"] + FAST + ALGO_FLAGS[algo] + where)
    assert any(note.startswith("--encoder my_encoder:make: a user's module") for note in plan.notes), plan.notes
    assert run(plan) == 0
    summary = read_json(tmp_path / "train" / algo / "summary.json")
    assert summary["learner_version"] > 0 and summary["updates_skipped_non_finite"] == 0, summary
    state = _policy_state(tmp_path / "train" / algo)
    prefix = {"ppo": "actor_encoder", "sac": "encoder", "crossq": "inputs.encoder"}.get(algo, "encoder")
    assert state["model"][f"{prefix}.user.linear.weight"].shape[0] == 32
    if algo == "sac":  # each critic and its target have their own
        assert state["critic"]["encoders.1.user.linear.weight"].shape[0] == 32
        assert "encoders.0.user.linear.bias" in state["target"]
    if algo == "crossq":  # the critics have one of their own
        assert state["critic"]["inputs.encoder.user.linear.weight"].shape[0] == 32
    assert os.listdir(shm_dir) == []


@pytest.mark.e2e
@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_a_ppo_run_resumes_plays_and_exports_with_the_users_module(user_dir, tmp_path, shm_dir, capsys):
    """The second run resumes from the first's checkpoint (the user's module rebuilt, its weights loaded);
    enjoy.py plays the result and export writes it, both finding my_encoder.py in the current directory. Once
    the file is edited to build another module, resuming is one line."""
    from sf_engine.play.export import main as export_main
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    where = ["--train_dir", str(tmp_path / "train"), "--experiment", "ppo"]
    flags = ["--encoder", "my_encoder:make"] + FAST + ALGO_FLAGS["ppo"][:-2] + where + ["--shm_dir", shm_dir]
    assert run(build_plan(flags + ["--train_for_env_steps", "1000"])) == 0
    first = _policy_state(tmp_path / "train" / "ppo")["model"]["actor_encoder.user.linear.weight"]
    resumed = build_plan(flags + ["--train_for_env_steps", "2000"])
    assert resumed.resume_from is not None and run(resumed) == 0
    second = _policy_state(tmp_path / "train" / "ppo")["model"]["actor_encoder.user.linear.weight"]
    assert not torch.equal(first, second)  # trained on after the resume
    capsys.readouterr()
    assert len(enjoy_episodes(capsys, *where, "--deterministic")) == 2
    assert export_main(where) == 0 and (tmp_path / "train" / "ppo" / "export" / "policy.onnx").exists()

    (user_dir / "my_encoder.py").write_text(MY_ENCODER.replace(", 32)", ", 8)"))  # edited since: 8 units
    del sys.modules["my_encoder"]
    capsys.readouterr()
    words = ["--encoder my_encoder:make: its module is not the one of the checkpoint", "[32, 4] in it, [8, 4] now"]
    again = ["--encoder", "my_encoder:make"] + FAST + ALGO_FLAGS["ppo"][:-2] + ["--experiment", "ppo"]
    again += ["--train_for_env_steps", "4000"]  # more than the checkpoint's: a run with something to train
    assert_refused_untouched(again + ["--shm_dir", shm_dir], tmp_path / "train", capsys, words)


@pytest.mark.e2e
def test_an_async_ppo_run_finds_the_module_in_every_process(user_dir, tmp_path, shm_dir):
    """train.py run from the directory that holds my_encoder.py: the learner and the policy worker (forkserver
    children) import it too."""
    flags = ["--encoder", "my_encoder:make", "--num_workers", "2", "--num_envs_per_worker", "8", "--device", "cpu"]
    flags += ["--rollout", "16", "--batch_size", "64", "--num_batches_per_epoch", "2", "--train_for_env_steps", "4000"]
    flags += ["--train_dir", str(tmp_path / "train"), "--experiment", "async", "--shm_dir", shm_dir]
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "train.py")] + flags,
        cwd=user_dir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_json(tmp_path / "train" / "async" / "summary.json")
    assert summary["mode"] == "async" and summary["learner_version"] > 0, summary
    assert "actor_encoder.user.linear.weight" in _policy_state(tmp_path / "train" / "async")["model"]
    assert "--encoder my_encoder:make: a user's module" in (tmp_path / "train" / "async" / "train.log").read_text()
    assert os.listdir(shm_dir) == []


@pytest.mark.e2e
def test_an_encoder_registered_by_name_trains_and_is_named_where_it_is_missing(registry, tmp_path, shm_dir, capsys):
    """register_encoder then --encoder NAME: a serial run trains it; enjoy.py in a process that did not register
    it says so in one line."""
    from conftest import main_error

    from sf_engine.play import enjoy
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    encoders.register_encoder("recorder", Recorder)
    where = ["--train_dir", str(tmp_path / "train"), "--experiment", "named"]
    plan = build_plan(["--encoder", "recorder"] + FAST + ALGO_FLAGS["ppo"] + where + ["--shm_dir", shm_dir])
    assert plan.registrations == ((encoders.register_encoder, "recorder", Recorder),)
    assert run(plan) == 0
    assert "actor_encoder.user.scale" in _policy_state(tmp_path / "train" / "named")["model"]
    capsys.readouterr()
    del encoders._REGISTRY["recorder"]
    error = main_error(enjoy.main, where, capsys)
    assert "--encoder recorder: no encoder of that name in this process" in error


def test_the_built_in_encoders_are_entries_of_the_same_registry():
    from sf_engine.model.cnn import ImpalaCNN, NatureCNN, SimpleCNN, SmallCNN

    builtin = {name: encoders.encoder_factory(name) for name in ("mlp", "nature_cnn", "impala_cnn", "convnet_simple")}
    assert all(isinstance(factory, encoders.BuiltinEncoder) for factory in builtin.values())
    assert isinstance(builtin["nature_cnn"].image_network((4, 84, 84), False), NatureCNN)
    assert isinstance(builtin["nature_cnn"].image_network((3, 7, 7), False), SmallCNN)
    assert isinstance(builtin["impala_cnn"].image_network((3, 64, 64), False), ImpalaCNN)
    assert isinstance(builtin["convnet_simple"].image_network((3, 72, 128), False), SimpleCNN)
    assert builtin["mlp"].cnn is None and not encoders.sees_whole_images("mlp")
    with pytest.raises(ConfigError, match="--encoder nosuch"):
        encoders.encoder_factory("nosuch")
