"""Whole runs of --algo sac on Pendulum-v1: a serial run learns on a small budget; an async run ends cleanly, resumes
from its checkpoint with its saved replay buffer, and its checkpoint plays greedy episodes in enjoy.py and exports
a policy whose action is the actor's squashed mean, within the env's bounds."""

import os

import numpy as np
import pytest
import torch
from conftest import enjoy_episodes, read_json, run_train

from sf_engine.replay.layout import REPLAY_FILLED

PENDULUM = ["--algo", "sac", "--env", "Pendulum-v1", "--num_workers", "1", "--hidden_size", "64", "--seed", "1"]


@pytest.mark.e2e
def test_sac_learns_pendulum_in_serial_mode(tmp_path, shm_dir):
    """From about -1200 (the untrained greedy policy) to a greedy evaluation better than -400 within 15,000 env
    steps (stopped at -300: 6,000 to 11,000 steps and 25 to 50 s on 2 cores over seeds 1 to 3, evaluations of
    -100 to -300). Evaluations are timed: the threshold leaves room."""
    result = run_train(
        PENDULUM
        + ["--mode", "serial", "--train_for_env_steps", "15000", "--learning_starts", "1000", "--replay_ratio", "256"]
        + ["--eval_every_sec", "3", "--eval_episodes", "5", "--stop_at_eval_return", "-300"]
        + ["--experiment", "pendulum", "--shm_dir", shm_dir],
        tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_json(tmp_path / "pendulum" / "summary.json")
    assert summary["algo"] == "sac" and summary["updates_skipped_non_finite"] == 0
    assert summary["eval_return_best"] > -400, summary["eval_return_best"]
    assert os.listdir(shm_dir) == []


@pytest.mark.e2e
def test_an_async_sac_run_resumes_with_its_replay_buffer(tmp_path, shm_dir):
    """The default (async) mode: a few thousand steps end cleanly with the replay ratio held; the resumed run
    refills its buffer with every transition of the saved one and goes on from the checkpoint's learner
    version."""
    flags = PENDULUM + ["--learning_starts", "500", "--replay_ratio", "16", "--batch_size", "64"]
    flags += ["--experiment", "async", "--shm_dir", shm_dir, "--save_replay", "true"]
    first = run_train(flags + ["--train_for_env_steps", "3000"], tmp_path, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    summary = read_json(tmp_path / "async" / "summary.json")
    assert summary["algo"] == "sac" and summary["mode"] == "async" and summary["learner_version"] > 0
    assert abs(summary["replay_ratio"] - 16) < 2, summary["replay_ratio"]
    assert summary["env_step_books"]["unaccounted"] == 0, summary["env_step_books"]
    assert (tmp_path / "async" / "checkpoints" / "replay.npz").exists() and os.listdir(shm_dir) == []
    # 2,000 env steps more: the budget is checked every quarter second, so the first run may pass 3,000 by thousands
    longer = summary["env_steps"] + 2000
    second = run_train(flags + ["--train_for_env_steps", str(longer)], tmp_path, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    log = (tmp_path / "async" / "train.log").read_text()  # the learner process's log
    assert f"replay.npz: {summary['replay_inserted_env_steps']:,} transitions" in log, log
    resumed = read_json(tmp_path / "async" / "summary.json")
    assert resumed["env_steps"] >= longer and resumed["learner_version"] > summary["learner_version"]
    assert resumed["replay_inserted_env_steps"] > summary["replay_inserted_env_steps"] + 1500
    assert os.listdir(shm_dir) == []


def assert_exported_squashed_mean(export_dir, model, obs: np.ndarray) -> None:
    """The exported ONNX and TorchScript files give Pendulum's torque 2 tanh(mean) of `model`, within [-2, 2]."""
    import onnxruntime

    with torch.no_grad():
        params, _ = model({"obs": torch.from_numpy(obs)})
    mean = 2.0 * torch.tanh(params[:, :1]).numpy()
    with torch.no_grad():
        script_action, _ = torch.jit.load(str(export_dir / "policy.torchscript.pt"))(torch.from_numpy(obs))
    onnx_action, _ = onnxruntime.InferenceSession(str(export_dir / "policy.onnx")).run(None, {"obs": obs})
    for action in (script_action.numpy(), onnx_action):
        assert action.shape == (len(obs), 1) and action.dtype == np.float32
        assert (np.abs(action) <= 2.0).all()
        np.testing.assert_allclose(action, mean, rtol=1e-5, atol=1e-5)


@pytest.mark.e2e
@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_enjoy_and_export_of_a_sac_checkpoint_act_on_the_squashed_mean(tmp_path, shm_dir, capsys):
    """enjoy.py --deterministic plays whole (200-step) greedy episodes, the same each time (sampled ones
    without it); export writes files whose action is the actor's squashed mean, within [-2, 2]: for the
    checkpoint, and for its actor with the means scaled up (torques across the whole range, saturated too)."""
    from sf_engine.model.sac_networks import SACActor
    from sf_engine.play.export import export
    from sf_engine.play.export import main as export_main
    from sf_engine.play.loading import load_experiment, load_policy, resolve_checkpoint
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    where = ["--train_dir", str(tmp_path), "--experiment", "sac"]
    flags = ["--mode", "serial", "--train_for_env_steps", "2000", "--learning_starts", "500", "--replay_ratio", "16"]
    assert run(build_plan(PENDULUM + where + flags + ["--shm_dir", shm_dir])) == 0
    capsys.readouterr()
    greedy = enjoy_episodes(capsys, *where, "--deterministic")
    assert greedy == enjoy_episodes(capsys, *where, "--deterministic") and {e[1] for e in greedy} == {"200"}
    assert enjoy_episodes(capsys, *where) != greedy  # without --deterministic the actor samples

    assert export_main(where) == 0
    cfg, spec, exp_dir = load_experiment(str(tmp_path), "sac")
    model = load_policy(cfg, spec, resolve_checkpoint(exp_dir, "sac", "latest"), "cpu")
    assert isinstance(model, SACActor)
    rng = np.random.default_rng(0)
    obs = (rng.normal(size=(512, 3)) * [1.0, 1.0, 8.0]).astype(np.float32)  # cos, sin, angular velocity, beyond
    assert_exported_squashed_mean(tmp_path / "sac" / "export", model, obs)
    last = [module for module in model.modules() if isinstance(module, torch.nn.Linear)][-1]
    with torch.no_grad():  # the mean's row: means standardized over `obs`, times 1.5
        means = model({"obs": torch.from_numpy(obs)})[0][:, 0]
        last.weight[0] *= 1.5 / means.std()
        last.bias[0] = (last.bias[0] - means.mean()) * 1.5 / means.std()
        actions = model.greedy({"obs": torch.from_numpy(obs)})[0]
    assert (actions.abs() > 1.9).any() and (actions.abs() < 1.0).any() and (actions > 0).any() and (actions < 0).any()
    export(model, spec, str(tmp_path / "scaled"))
    assert_exported_squashed_mean(tmp_path / "scaled", model, obs)


def test_the_replay_source_gives_sac_the_box_actions_the_workers_took(tmp_path, shm_dir):
    """Stepped by hand (serial mode's roles): the minibatches SAC trains on carry the stored actions, [B, 1]
    float32 torques within [-2, 2], not cast to integers."""
    from conftest import SerialRun, serial_plan

    plan = serial_plan(
        tmp_path, shm_dir, "Pendulum-v1", "--algo", "sac", "--learning_starts", "64", "--hidden_size", "32"
    )
    run = SerialRun(plan, tmp_path)
    try:
        algorithm, batches = run.learner.policies[0].algorithm, []
        train = algorithm.train
        algorithm.train = lambda batch: batches.append(batch) or train(batch)
        for _ in range(300):
            run.worker.step(0)
            run.policy.step(0)
            run.learner.step(0)
            if batches:
                break
        actions = batches[0].actions
        assert actions.dtype == torch.float32 and actions.shape == (32, 1)
        assert (actions.abs() <= 2.0).all() and (actions != actions.round()).any()
        stored = run.learner.source.buffer.arrays["actions"]
        assert np.isin(actions.numpy(), stored).all()
    finally:
        run.close()


def test_the_input_normalizer_learns_each_inserted_step_once_under_prioritized_replay(tmp_path, shm_dir):
    """--normalize_input with --prioritized, whose minibatches come in buffer order (the sum tree's strata): the
    actor's running statistics are those of every trainable env step inserted into the buffer, each merged once,
    not of a slice of each minibatch (which would keep to the same few columns)."""
    from conftest import SerialRun, serial_plan

    plan = serial_plan(
        tmp_path,
        shm_dir,
        "Pendulum-v1",
        *("--algo", "sac", "--normalize_input", "true", "--prioritized", "true", "--n_step", "1"),
        *("--learning_starts", "256", "--replay_ratio", "32", "--hidden_size", "32"),
    )
    run = SerialRun(plan, tmp_path)
    try:
        algorithm = run.learner.policies[0].algorithm
        for _ in range(2000):
            run.worker.step(0)
            run.policy.step(0)
            run.learner.step(0)
            if algorithm.num_updates >= 40:
                break
        assert algorithm.num_updates >= 40
        buffer = run.learner.source.buffer
        filled = int(buffer.counters[REPLAY_FILLED])
        assert filled * buffer.rollout == buffer.size < buffer.capacity  # nothing overwritten yet
        rows = buffer.obs["obs"][:filled, :-1][buffer.arrays["trainable"][:filled]].astype(np.float64)
        normalizer = algorithm.model.normalizer
        assert abs(float(normalizer.count) - len(rows)) < 1e-2, (float(normalizer.count), len(rows))
        np.testing.assert_allclose(normalizer.mean.numpy(), rows.mean(0), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(normalizer.var.numpy(), rows.var(0), rtol=1e-3, atol=1e-4)
    finally:
        run.close()


def acted(run, slots: list):
    """(actions [N], log-probabilities [N], versions [N]) of every step of the full `slots`, then back to free."""
    b = run.buffers
    out = tuple(np.concatenate([array[slot].reshape(-1) for slot in slots]) for array in (b.actions, b.log_probs))
    versions = np.concatenate([b.policy_version[slot].reshape(-1) for slot in slots])
    run.queues.free_slots.put_many(slots)
    return (*out, versions)


@pytest.mark.parametrize("random_before_learning", ["true", "false"])
def test_sac_acts_uniformly_at_random_until_the_learner_publishes_an_update(tmp_path, shm_dir, random_before_learning):
    """Stepped by hand (serial mode's roles): with --random_before_learning true the rows acted by version 0 (the
    weights published before any update) take actions uniform within Pendulum's [-2, 2] (their log-probability
    the uniform's, -log 2; the actions' distribution function within the Kolmogorov-Smirnov bound of the uniform),
    and once the learner publishes version 1 the actor samples; with false the actor samples from the start."""
    from conftest import SerialRun, serial_plan

    plan = serial_plan(
        tmp_path,
        shm_dir,
        "Pendulum-v1",
        *("--algo", "sac", "--random_before_learning", random_before_learning, "--hidden_size", "32"),
        *("--num_envs_per_worker", "16", "--worker_num_splits", "1", "--rollout", "64", "--learning_starts", "100000"),
    )
    run = SerialRun(plan, tmp_path)
    try:
        actions, log_probs, versions = map(np.concatenate, zip(*(acted(run, run.full_slots(1)) for _ in range(4))))
        assert (versions == 0).all() and len(actions) == 4096  # 4 slots of 64 steps x 16 envs
        uniform = random_before_learning == "true"
        assert np.array_equal(log_probs, np.full_like(log_probs, -np.log(2.0))) == uniform
        below = np.searchsorted(np.sort(actions), np.linspace(-2, 2, 81), side="right") / len(actions)
        assert (np.abs(below - np.linspace(0, 1, 81)).max() < 1.95 / np.sqrt(len(actions))) == uniform
        assert (np.abs(actions) <= 2.0).all()
        run.learner.policies[0].publish()  # version 1, as after the learner's first update
        acted(run, run.full_slots(1))  # the slot begun by version 0
        actions, log_probs, versions = acted(run, run.full_slots(1))
        assert (versions == 1).all() and not np.isclose(log_probs, -np.log(2.0)).any()
    finally:
        run.close()
