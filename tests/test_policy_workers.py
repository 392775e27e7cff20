"""--num_policy_workers: several policy workers, each serving its share of the rollout workers (with --device cuda
each on its own GPU): a run learns with them, a killed one restarts with only the rollout workers it serves, and
what they do not run is refused in one line."""

import os
import re
import signal

import pytest
from conftest import one_line_error, read_json, run_train
from test_reliability import (  # noqa: F401  (no_leftover_runs: the autouse fixture that kills what a test left)
    books_balance,
    no_leftover_runs,
    start_train,
    wait_for,
    wait_for_children,
    wait_for_steps,
)

TWO = ["--env", "CartPole-v1", "--seed", "1", "--num_workers", "2", "--num_policy_workers", "2"]


def test_auto_is_a_policy_worker_per_gpu_where_rollout_workers_act_through_them(monkeypatch):
    from sf_engine.config.cli import make_config, parse_flags
    from sf_engine.run import per_gpu

    def resolved(gpus: int, *flags: str):
        monkeypatch.setattr(per_gpu, "cuda_device_count", lambda: gpus)
        cfg = make_config(parse_flags(["--device", "cuda" if gpus else "cpu", "--num_workers", "2", *flags]))
        cfg, lines = per_gpu.resolve_policy_workers(cfg)
        return cfg.parallel.num_policy_workers, lines

    assert resolved(2) == (2, ["--num_policy_workers auto = 2: one per GPU, each serving 1/2 of the rollout workers"])
    assert resolved(4)[0] == 2  # at most one per rollout worker
    assert resolved(0) == (1, []) and resolved(1) == (1, [])
    assert resolved(4, "--mode", "serial")[0] == 1 and resolved(4, "--deterministic", "true")[0] == 1
    assert resolved(4, "--num_policy_workers", "1")[0] == 1


@pytest.mark.e2e
def test_two_policy_workers_each_serve_their_rollout_workers_and_the_run_learns(tmp_path, shm_dir):
    result = run_train(
        TWO + ["--experiment", "two", "--shm_dir", shm_dir, "--train_for_env_steps", "1000000"],
        tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_json(tmp_path / "two" / "summary.json")
    assert summary["episode_return_mean"] > 100, summary["episode_return_mean"]  # a random policy's is about 22
    for worker in ("policy_worker", "policy_worker_1"):  # each served requests: forward passes of its own
        assert summary["stage_seconds"][worker]["forward"] > 0, summary["stage_seconds"]
    books_balance(summary)
    log = (tmp_path / "two" / "train.log").read_text()
    assert re.search(r"policy_worker\[0\] INFO ready: .* serving rollout worker\(s\) \[0\]", log), log[-2000:]
    assert re.search(r"policy_worker\[1\] INFO ready: .* serving rollout worker\(s\) \[1\]", log), log[-2000:]
    assert os.listdir(shm_dir) == []


@pytest.mark.e2e
def test_a_killed_policy_worker_restarts_with_the_rollout_workers_it_serves_only(tmp_path, shm_dir):
    exp = str(tmp_path / "kill")
    args = TWO + ["--num_envs_per_worker", "16", "--batch_size", "512", "--rollout", "32", "--shm_dir", shm_dir]
    args += ["--train_for_env_steps", "250000", "--train_for_seconds", "90"]
    proc = start_train(args, tmp_path, "kill")
    rows = wait_for_children(exp, 5)
    wait_for_steps(exp, 30_000)
    os.kill(next(r["pid"] for r in rows if r["role"] == "policy_worker" and r["index"] == 1), signal.SIGKILL)
    wait_for(exp, "policy_worker_restarts", 1)
    after_kill = read_json(os.path.join(exp, "summary.json"))["env_steps"]
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    summary = read_json(os.path.join(exp, "summary.json"))
    assert summary["policy_worker_restarts"] == 1 and summary["env_steps"] > after_kill + 50_000, summary
    books_balance(summary)
    log = open(os.path.join(exp, "train.log")).read()
    assert "restarted policy worker 1 (weights from the shared copy) and the rollout workers it serves" in log
    assert re.search(r"rollout_worker\[1\] INFO ready: .*\(generation 1\)", log), log[-3000:]
    assert not re.search(r"rollout_worker\[0\] INFO ready: .*\(generation 1\)", log), "worker 0 was restarted too"
    assert len(re.findall(r"policy_worker\[1\] INFO ready", log)) == 2
    assert os.listdir(shm_dir) == []


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--num_policy_workers", "0"], "--num_policy_workers must be at least 1"),
        (["--num_policy_workers", "2", "--mode", "serial"], "--mode serial runs every role in one process"),
        (["--num_policy_workers", "2", "--num_workers", "2", "--deterministic", "true"], "--deterministic true"),
        (["--num_policy_workers", "3", "--num_workers", "2"], "each serves at least one of the --num_workers 2"),
        (["--num_policy_workers", "2", "--env", "TorchCartPole-v1"], "sampled by device samplers"),
    ],
)
def test_what_several_policy_workers_do_not_run_is_refused_in_one_line(tmp_path, flags, words):
    result = run_train(["--env", "CartPole-v1", "--train_for_env_steps", "1000"] + flags, tmp_path, timeout=120)
    assert words in one_line_error(result)
    assert not os.path.exists(tmp_path / "default"), "a refused run wrote its experiment directory"
