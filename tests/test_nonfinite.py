"""Non-finite numbers never reach the weights: an env's NaN or inf observations and rewards are skipped and
counted, a learner update with a non-finite loss is skipped, weights with a non-finite value are never
published or saved, and a run whose updates stay non-finite stops with one line."""

import glob
import os

import numpy as np
import pytest
import torch
from conftest import TINY, SerialRun, read_json, run_train, serial_plan

TESTS = os.path.dirname(os.path.abspath(__file__))


def _non_finite_tensors(path) -> list:
    """The names of a checkpoint's float tensors (weights and optimizer state) holding a NaN or inf."""
    from sf_engine.runtime.checkpoint import load_checkpoint

    state = load_checkpoint(path)
    tensors = dict(state["model"]) | {f"optimizer.{k}": v for k, v in state["optimizer"]["state"][0].items()}
    return [name for name, value in tensors.items() if value.is_floating_point() and not torch.isfinite(value).all()]


@pytest.mark.e2e
@pytest.mark.parametrize(
    "env, what",
    [("toy_envs:NaNAfterEnv", "observation"), ("toy_envs:InfRewardAfterEnv", "reward")],
    ids=["nan_obs", "inf_reward"],
)
def test_an_env_turning_non_finite_leaves_every_checkpoint_finite_and_is_named_once(tmp_path, shm_dir, env, what):
    # every env turns non-finite after its 200th step: most of the run's samples hold a NaN or inf
    flags = ["--env", env, "--shm_dir", shm_dir, "--experiment", "nan", "--train_for_env_steps", "6000"]
    result = run_train(
        TINY + flags + ["--save_every_sec", "0.2", "--keep_checkpoints", "3"],
        tmp_path,
        env={**os.environ, "PYTHONPATH": TESTS},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    paths = glob.glob(str(tmp_path / "nan" / "checkpoints" / "checkpoint_*.pt"))
    assert paths
    assert {os.path.basename(path): _non_finite_tensors(path) for path in paths} == {
        os.path.basename(path): [] for path in paths
    }
    summary = read_json(tmp_path / "nan" / "summary.json")
    books = summary["env_step_books"]
    assert books["skipped_non_finite"] > 3000 and books["unaccounted"] == 0, books
    # the episodes' returns stay the env's own (an inf reward counts 0)
    assert summary["episode_return_mean"] == 50.0 if what == "observation" else 0 <= summary["episode_return_mean"] < 50
    named = [line for line in result.stdout.splitlines() if f"returned a non-finite {what}" in line]
    assert sorted(line.split("(worker 0, ")[1].split(")")[0] for line in named) == [f"env {i}" for i in range(4)]
    assert all("its samples are skipped" in line for line in named)


@pytest.mark.parametrize("flags", [[], ["--rnn", "gru"]], ids=["feed_forward", "recurrent"])
def test_an_update_with_a_non_finite_loss_is_skipped_and_counted(tmp_path, shm_dir, flags):
    run = SerialRun(serial_plan(tmp_path, shm_dir, "CartPole-v1", *flags), tmp_path)
    try:
        algorithm = run.learner.policies[0].algorithm
        batch = run.learner.source.gather(run.full_slots(run.cfg.slots_per_batch))
        batch.keep = batch.valid
        before = algorithm.params.clone()
        clean = batch.rewards.clone()
        batch.rewards[:] = float("nan")  # every minibatch's loss is NaN
        result = algorithm.train(batch)
        assert (result.updates, result.skipped_updates) == (0, 2)  # 1 epoch x 2 minibatches
        assert torch.equal(algorithm.params, before) and result.losses == {}
        batch.rewards[:] = clean
        result = algorithm.train(batch)
        assert (result.updates, result.skipped_updates) == (2, 0)
        assert bool(torch.isfinite(algorithm.params).all()) and not torch.equal(algorithm.params, before)
    finally:
        run.close()


def test_weights_with_a_non_finite_value_are_neither_published_nor_saved(tmp_path, shm_dir):
    run = SerialRun(serial_plan(tmp_path, shm_dir, "CartPole-v1"), tmp_path)
    try:
        learner = run.learner
        policy = learner.policies[0]
        first = learner.save()
        published = policy.params.clone()
        with torch.no_grad():
            policy.params[3] = float("inf")
        assert policy.publish() is False and policy.version == 0
        assert torch.equal(policy.params, published)  # the last published weights are back
        with torch.no_grad():
            policy.params[3] = float("nan")
        assert learner.save() is None
        assert os.listdir(run.plan.paths.checkpoint_dir) == [os.path.basename(first)]
    finally:
        run.close()


def test_a_non_finite_continuous_action_never_reaches_the_env(tmp_path, shm_dir, caplog):
    run = SerialRun(serial_plan(tmp_path, shm_dir, "Pendulum-v1"), tmp_path)
    try:
        worker, buffers = run.worker, run.buffers
        run.policy.step(0)  # the actions the worker asked for when it reset its envs
        slot, row = worker.slot[0], worker.row[0]
        buffers.actions[slot, row, 1] = np.nan
        buffers.valid[slot, row] = True
        worker._advance(0)
        assert buffers.actions[slot, row, 1].tolist() == [0.0] and buffers.log_probs[slot, row, 1] == 0.0
        assert list(buffers.valid[slot, row]) == [True, False] and list(buffers.non_finite[slot, row]) == [False, True]
        assert "env Pendulum-v1 (worker 0, env 1) got a non-finite action from the policy" in caplog.text
    finally:
        run.close()


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["serial", "async"])
def test_updates_non_finite_in_a_row_stop_the_run_with_one_line(tmp_path, shm_dir, mode):
    # a learning rate of 1e30: after the first step the values overflow, and every loss is inf or NaN
    result = run_train(
        TINY
        + ["--mode", mode, "--shm_dir", shm_dir, "--experiment", "diverged", "--train_for_env_steps", "200000"]
        + ["--learning_rate", "1e30", "--max_bad_updates", "6"],
        tmp_path,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    stopped = [line for line in result.stdout.splitlines() if "stopped: " in line]
    assert len(stopped) == 1, result.stdout
    assert "updates in a row had a non-finite loss or gradient" in stopped[0], stopped
    assert "--max_bad_updates 6" in stopped[0] and "--learning_rate" in stopped[0], stopped
    assert "Traceback" not in result.stdout + result.stderr
    assert read_json(tmp_path / "diverged" / "summary.json")["updates_skipped_non_finite"] >= 6
    for path in glob.glob(str(tmp_path / "diverged" / "checkpoints" / "checkpoint_*.pt")):
        assert _non_finite_tensors(path) == [], path
    assert os.listdir(shm_dir) == []


def test_a_rotation_never_removes_the_checkpoint_just_written_nor_any_before_it_reads_back(tmp_path, monkeypatch):
    from sf_engine.runtime import checkpoint

    directory = str(tmp_path)
    newest = checkpoint.save_checkpoint(directory, {"version": 9}, 9, 900, 3)
    with open(newest, "r+b") as f:
        f.write(b"garbage")  # corrupted: a run resumes from the checkpoint before it, so its versions are older
    path = checkpoint.save_checkpoint(directory, {"version": 5}, 5, 500, 1)
    assert checkpoint.list_checkpoints(directory) == [path]
    assert checkpoint.load_checkpoint(path) == {"version": 5}

    def mismatch(read_path):
        raise checkpoint.CheckpointError(f"{read_path} is truncated or corrupted (checksum mismatch)")

    monkeypatch.setattr(checkpoint, "read_verified", mismatch)  # the new file does not read back as written
    with pytest.raises(OSError, match="read back"):
        checkpoint.save_checkpoint(directory, {"version": 6}, 6, 600, 1)
    assert checkpoint.list_checkpoints(directory) == [path]
