"""Command line: --help, one-line errors for bad input before any process starts."""
import os

import pytest

from conftest import one_line_error, run_train


def test_help_explains_every_flag(tmp_path):
    result = run_train(["--help"], tmp_path)
    assert result.returncode == 0
    for flag in ("--env", "--env_backend", "--experiment", "--train_dir", "--num_workers", "--num_envs_per_worker",
                 "--worker_num_splits", "--rollout", "--batch_size", "--num_epochs", "--learning_rate", "--gamma",
                 "--gae_lambda", "--device", "--mode", "--with_vtrace", "--max_policy_lag", "--seed",
                 "--train_for_env_steps", "--train_for_seconds", "--stop_at_return", "--save_every_sec", "--rnn",
                 "--rnn_size", "--recurrence", "--stuck_timeout_sec", "--max_worker_restarts"):
        assert flag in result.stdout, flag


@pytest.mark.parametrize("args, words", [
    (["--env", "NoSuchEnv-v0"], ["--env NoSuchEnv-v0", "unknown"]),
    (["--rollout", "1"], ["--rollout", "at least 2"]),
    (["--rnn", "gru", "--recurrence", "5"], ["--recurrence", "--rollout"]),
    (["--batch_size", "1000", "--num_envs_per_worker", "128"], ["--batch_size", "multiple"]),
    (["--batch_size", "1000", "--rollout", "48"], ["--batch_size", "--rollout"]),
    (["--num_envs_per_worker", "7", "--worker_num_splits", "2"], ["--num_envs_per_worker", "--worker_num_splits"]),
    (["--device", "cuda"], ["--device cuda", "--device cpu"]),
    (["--rollout", "100000", "--num_envs_per_worker", "20000", "--batch_size", "1000000000"],
     ["MiB", "--num_envs_per_worker"]),
    (["--mode", "sync", "--batch_size", "65536", "--num_batches_per_epoch", "8"], ["--mode sync", "--batch_size"]),
])
def test_bad_input_is_one_line_naming_the_flag(tmp_path, shm_dir, args, words):
    line = one_line_error(run_train(["--shm_dir", shm_dir] + args, tmp_path))
    for word in words:
        assert word in line
    assert os.listdir(shm_dir) == []


def test_bad_flag_value_is_rejected_by_the_parser(tmp_path):
    result = run_train(["--mode", "fast"], tmp_path)
    assert result.returncode == 2 and "--mode" in result.stderr


def test_resuming_with_another_model_is_refused(tmp_path, shm_dir):
    base = ["--experiment", "resume", "--mode", "serial", "--shm_dir", shm_dir, "--num_workers", "1",
            "--num_envs_per_worker", "8", "--batch_size", "256", "--train_for_env_steps", "3000"]
    assert run_train(base, tmp_path).returncode == 0
    line = one_line_error(run_train(base + ["--hidden_size", "32", "--train_for_env_steps", "6000"], tmp_path))
    assert "--hidden_size" in line and "--restart" in line
    assert run_train(base + ["--hidden_size", "32", "--restart"], tmp_path).returncode == 0
