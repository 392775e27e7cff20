"""Export: the ONNX and TorchScript files of a trained policy run without sf_engine and choose the
actions the engine's own policy chooses, on observations recorded from the env (with a recurrent
core, along whole recorded trajectories, the state fed back)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO, main_error

# runs the exported files in a fresh interpreter in which sf_engine cannot be imported
_STANDALONE = r"""
import sys
sys.modules["sf_engine"] = None  # import sf_engine now fails
import numpy as np, onnxruntime, torch
export_dir, obs_path, recurrent = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
observations = np.load(obs_path)  # [T, B, ...]
session = onnxruntime.InferenceSession(f"{export_dir}/policy.onnx")
scripted = torch.jit.load(f"{export_dir}/policy.torchscript.pt")
state_size = session.get_inputs()[1].shape[1] if recurrent else 0
state = np.zeros((observations.shape[1], state_size), np.float32)
script_state = torch.zeros(observations.shape[1], state_size)
onnx_actions, script_actions = [], []
for obs in observations:
    outputs = session.run(None, {"obs": obs, "state": state} if recurrent else {"obs": obs})
    with torch.no_grad():
        script = scripted(torch.as_tensor(obs), script_state) if recurrent else scripted(torch.as_tensor(obs))
    onnx_actions.append(outputs[0])
    script_actions.append(script[0].numpy())
    if recurrent:
        state, script_state = outputs[2], script[2]
np.save(sys.argv[4], np.stack([np.stack(onnx_actions), np.stack(script_actions)]))
"""


def _record(train_dir, experiment, steps=60, num_envs=8):
    """Observations [T, B, 4] of CartPole played by the experiment's own policy (greedy, the engine's
    acting path), and its actions [T, B]."""
    from sf_engine.envs import make_batch_env
    from sf_engine.play.episodes import act
    from sf_engine.play.loading import load_experiment, load_policy, resolve_checkpoint

    cfg, spec, exp_dir = load_experiment(str(train_dir), experiment)
    model = load_policy(cfg, spec, resolve_checkpoint(exp_dir, experiment, "latest"), "cpu")
    env = make_batch_env(cfg.env.env, cfg.env.env_backend, num_envs, seed=7, spec=spec, training=False)
    obs, state, observations, actions = env.reset(), model.initial_state(num_envs), [], []
    for _ in range(steps):
        observations.append(obs["obs"])
        chosen, state = act(model, {"obs": torch.as_tensor(obs["obs"])}, state, deterministic=True)
        actions.append(chosen.numpy())
        obs = env.step(chosen.numpy()).obs
    env.close()
    return np.stack(observations), np.stack(actions)


@pytest.mark.e2e
@pytest.mark.parametrize("model_flags", [[], ["--rnn", "gru"]], ids=["mlp", "gru"])
def test_exported_policy_runs_without_sf_engine_and_chooses_the_same_actions(tmp_path, shm_dir, model_flags):
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    assert (
        run(
            build_plan(
                [
                    "--train_dir",
                    str(tmp_path),
                    "--experiment",
                    "trained",
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
                    "100000",
                ]
                + model_flags
            )
        )
        == 0
    )
    result = subprocess.run(
        [sys.executable, "-m", "sf_engine.play.export", "--train_dir", str(tmp_path), "--experiment", "trained"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    export_dir = tmp_path / "trained" / "export"
    info = json.loads((export_dir / "policy.json").read_text())
    assert [i["name"] for i in info["inputs"]] == ["obs"] + (["state"] if model_flags else [])
    observations, actions = _record(tmp_path, "trained")
    assert 0.2 < actions.mean() < 0.8  # a policy that uses both actions: the comparison means something
    np.save(tmp_path / "obs.npy", observations)
    standalone = subprocess.run(
        [
            sys.executable,
            "-c",
            _STANDALONE,
            str(export_dir),
            str(tmp_path / "obs.npy"),
            "1" if model_flags else "0",
            str(tmp_path / "actions.npy"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert standalone.returncode == 0, standalone.stderr
    onnx_actions, script_actions = np.load(tmp_path / "actions.npy")
    assert (onnx_actions == actions).all() and (script_actions == actions).all()


def _bounded():
    from gymnasium import spaces

    return spaces.Box(np.array([-0.5, 0.0], np.float32), np.array([0.5, 2.0], np.float32))


def _synthetic(spec, **model_flags):
    from sf_engine.config.groups import ModelConfig
    from sf_engine.model.actor_critic import ActorCritic
    from sf_engine.model.shape import resolve_model_config

    torch.manual_seed(0)
    model = ActorCritic(spec, resolve_model_config(ModelConfig(**model_flags), spec)).eval()
    for normalizer in model.actor_encoder.normalizers.values():  # statistics as a trained model has them
        normalizer.mean.uniform_(-1, 1)
        normalizer.var.uniform_(0.5, 2)
    return model


@pytest.mark.parametrize(
    "kind", ["dict_images_multi_discrete", "continuous", "discrete_with_start", "multi_binary", "composite"]
)
def test_onnx_matches_torch_for_every_observation_and_action_kind(tmp_path, kind):
    import onnxruntime

    from sf_engine.envs import ActionSpec, EnvSpec
    from sf_engine.play.export import export

    if kind == "dict_images_multi_discrete":
        spec = EnvSpec(
            (("image", (7, 7, 3), "uint8"), ("position", (5,), "float32")),
            ActionSpec("multi_discrete", nvec=(3, 4), start=(0, 0)),
            family="image",
        )
        model = _synthetic(spec, normalize_input=True)
    elif kind == "continuous":
        spec = EnvSpec(
            (("obs", (6,), "float32"),),
            ActionSpec("continuous", shape=(2,), low=(-0.5, -1.0), high=(0.5, 1.0)),
            family="continuous",
        )
        model = _synthetic(spec, rnn="lstm", actor_critic="separate")
        with torch.no_grad():
            model.policy_head.weight.mul_(100)  # means beyond the bounds: clipped as the env clips them
    elif kind in ("multi_binary", "composite"):
        from gymnasium import spaces

        from sf_engine.envs.spec import action_spec

        bits = spaces.MultiBinary(3)
        space = bits if kind == "multi_binary" else spaces.Tuple((spaces.Discrete(4, start=1), bits, _bounded()))
        spec = EnvSpec((("obs", (4,), "float32"),), action_spec("env", space))
        model = _synthetic(spec)
        if kind == "composite":
            with torch.no_grad():  # the Box part's means beyond its bounds: clipped as the env clips them
                model.policy_head.bias[-2:] = torch.tensor([5.0, -5.0])
    else:
        spec = EnvSpec((("obs", (4,), "float32"),), ActionSpec("discrete", nvec=(5,), start=(-2,)))
        model = _synthetic(spec)
    export(model, spec, str(tmp_path), "onnx")
    session = onnxruntime.InferenceSession(str(tmp_path / "policy.onnx"))
    rng = np.random.default_rng(0)
    obs = {
        key: (rng.integers(0, 256, (9, *shape)) if dtype == "uint8" else rng.normal(size=(9, *shape)) * 3).astype(dtype)
        for key, shape, dtype in spec.obs
    }
    state = rng.normal(size=(9, model.state_size)).astype(np.float32) if model.recurrent else None
    outputs = session.run(None, {**obs, **({"state": state} if model.recurrent else {})})
    with torch.no_grad():
        params, values, new_state = model.outputs(
            {k: torch.as_tensor(v) for k, v in obs.items()}, None if state is None else torch.as_tensor(state)
        )
    values = model.denormalize_values(values).numpy()
    np.testing.assert_allclose(outputs[1], values, rtol=1e-4, atol=1e-4)
    if kind == "continuous":
        clipped = np.clip(params.numpy(), spec.action.low, spec.action.high)
        assert (clipped == np.asarray(spec.action.low)).any() and (clipped == np.asarray(spec.action.high)).any()
        np.testing.assert_allclose(outputs[0], clipped, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(outputs[2], new_state.numpy(), rtol=1e-4, atol=1e-4)
    elif kind == "composite":  # each part's env actions side by side: the start added, the Box part clipped
        parts = spec.action.env_actions(model.distribution.mode(params).numpy())
        assert (parts[2] == [0.5, 0.0]).all()  # the high bound of one, the low one of the other
        np.testing.assert_allclose(outputs[0], np.concatenate([p.reshape(9, -1) for p in parts], 1), rtol=1e-5)
        info = json.load(open(tmp_path / "policy.json"))["action"]
        assert [(p["kind"], p["columns"]) for p in info["parts"]] == [
            ("discrete", [0, 1]),
            ("multi_binary", [1, 4]),
            ("continuous", [4, 6]),
        ]
    else:
        assert (outputs[0] == model.distribution.mode(params).numpy() + np.asarray(spec.action.start or 0)).all()


def test_export_of_a_missing_experiment_or_without_onnx_is_one_line(tmp_path, capsys, monkeypatch):
    import importlib.util

    from sf_engine.play.export import main

    line = main_error(main, ["--train_dir", str(tmp_path), "--experiment", "nothing"], capsys)
    assert "no experiment" in line and "--experiment" in line
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else find_spec(name, *a)
    )
    line = main_error(main, ["--train_dir", str(tmp_path), "--experiment", "nothing"], capsys)
    assert "onnxscript" in line and "pip install 'sf_engine[onnx]'" in line and "--format torchscript" in line
    assert os.listdir(tmp_path) == []
