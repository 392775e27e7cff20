"""--num_learners: learner ranks of one policy, data-parallel (sf_engine.runtime.ranks): they learn as one learner
does, report their figures once, stop together, start again together when one dies, and their checkpoints resume
with any number of ranks."""

import os
import re
import signal
import time

import pytest
import torch
from conftest import one_line_error, read_json, run_train
from test_reliability import (  # noqa: F401  (no_leftover_runs: the autouse fixture that kills what a test left)
    books_balance,
    no_leftover_runs,
    start_train,
    wait_for,
    wait_for_children,
    wait_for_steps,
)

from sf_engine.model.features import RunningMeanStd
from sf_engine.runtime.shared_buffers import TRAINING_STATE_SUFFIX

CARTPOLE = ["--env", "CartPole-v1", "--num_learners", "2", "--seed", "1"]
REPLAY_SHORT = ["--train_for_env_steps", "4000", "--learning_starts", "1000"]


def test_normalizer_statistics_merged_over_ranks_are_those_of_the_whole_batch():
    """Each rank's batch statistics gathered and merged in rank order: the running mean and variance of the two
    halves are those of one learner's update on the whole batch (a rank without samples changes nothing)."""
    torch.manual_seed(0)
    batch = torch.randn(300, 3) * torch.tensor([1.0, 5.0, 0.1]) + torch.tensor([2.0, -1.0, 0.5])
    halves = batch[:120], batch[120:]
    whole = RunningMeanStd((3,))
    whole.update(batch)
    sent = []
    other = RunningMeanStd((3,))
    other.gather = lambda row: sent.append(row) or row[None]  # rank 1: its row, as it goes into the gather
    other.update(halves[1])
    ranked = RunningMeanStd((3,))
    ranked.gather = lambda row: torch.stack([row, sent[0]])  # rank 0 gets both rows
    ranked.update(halves[0])
    torch.testing.assert_close(ranked.mean, whole.mean)
    torch.testing.assert_close(ranked.var, whole.var)
    torch.testing.assert_close(ranked.count, whole.count)
    before = ranked.mean.clone()
    ranked.gather = lambda row: torch.stack([row, row])  # two ranks without samples
    ranked.update(torch.zeros(0, 3))
    torch.testing.assert_close(ranked.mean, before)


def test_a_stop_within_a_long_round_is_agreed_every_few_steps_on_every_rank():
    """Within a round the ranks ask each other whether the run stops every STOP_CHECK_STEPS minibatch steps (one
    all-reduce each), so a long round ends early at a stop on every rank alike; a new round starts without it."""
    from types import SimpleNamespace

    from sf_engine.roles.learner_ranks import STOP_CHECK_STEPS, LearnerRanks
    from sf_engine.runtime.ranks import Agreement

    asked = []
    ranks = LearnerRanks.__new__(LearnerRanks)  # its state without a group of processes
    ranks.ctx = SimpleNamespace(stop_signalled=False)
    ranks.group = SimpleNamespace(agree=lambda *args: asked.append(args) or Agreement(args[0], args[1], 0, 0.0))
    ranks.round_steps, ranks.round_stop = 0, False
    assert not any(ranks.stopping() for _ in range(2 * STOP_CHECK_STEPS)) and len(asked) == 2
    ranks.ctx.stop_signalled = True
    answers = [ranks.stopping() for _ in range(STOP_CHECK_STEPS)]
    assert answers == [False] * (STOP_CHECK_STEPS - 1) + [True] and len(asked) == 3
    assert ranks.stopping() and len(asked) == 3  # agreed: no more collectives in this round
    # a replay round's time (a rank's chunk of updates over) ends it alike, the run going on
    ranks.ctx.stop_signalled, ranks.round_steps, ranks.round_stop = False, 0, False
    answers = [ranks.round_over(step >= 3) for step in range(STOP_CHECK_STEPS)]
    assert answers == [False] * (STOP_CHECK_STEPS - 1) + [True] and asked[-1][:2] == (0, False)


def test_num_learners_auto_is_a_rank_per_gpu_where_the_run_can_have_several(monkeypatch):
    """auto: one rank per visible GPU on CUDA; 1 on the CPU, on one GPU, or where several ranks would be refused
    (the refusal said in the note)."""
    from sf_engine.config.cli import make_config, parse_flags
    from sf_engine.run import per_gpu

    def resolved(gpus: int, *flags: str):
        monkeypatch.setattr(per_gpu, "cuda_device_count", lambda: gpus)
        monkeypatch.setattr(per_gpu, "resolve_device", lambda device: "cuda" if gpus else "cpu")
        cfg, notes = per_gpu.resolve_learners(make_config(parse_flags(["--num_learners", "auto", *flags])))
        return cfg.parallel.num_learners, notes[0]

    assert resolved(4) == (4, "auto sizing: --num_learners auto = 4: a learner rank per GPU")
    assert resolved(0) == (1, "auto sizing: --num_learners auto = 1: no GPU in use")
    assert resolved(1) == (1, "auto sizing: --num_learners auto = 1: 1 GPU")
    ranks, note = resolved(8, "--num_policies", "2")
    assert ranks == 1 and "--num_learners 8: --num_policies > 1: the ranks train one policy" in note
    assert resolved(4, "--env", "TorchCartPole-v1") == (
        1,
        "auto sizing: --num_learners auto = 1: a device env is sampled on its one learner's device",
    )
    assert per_gpu.resolve_learners(make_config(parse_flags(["--num_learners", "3"])))[0].parallel.num_learners == 3


def test_learner_devices_place_each_rank_on_the_gpu_named(monkeypatch):
    """--learner_devices: rank r on the r-th device named; by default GPU r with --device cuda, else the CPU. Ranks
    on GPUs of their own meet over NCCL, ranks that share one over gloo (more ranks than GPUs then); a GPU that is not
    visible is one line, and so is a GPU shared with node groups (whose ranks meet over NCCL)."""
    import dataclasses

    from sf_engine.config.cli import make_config, parse_flags
    from sf_engine.config.groups import ConfigError
    from sf_engine.run import per_gpu

    cfg = make_config(
        parse_flags(["--num_learners", "2", "--num_policy_workers", "1", "--learner_devices", "cuda:3, cuda:1"])
    )
    assert [cfg.parallel.learner_device("cuda", r) for r in range(2)] == ["cuda:3", "cuda:1"]
    plain = make_config(parse_flags(["--num_learners", "2"])).parallel
    assert [plain.learner_device("cuda", r) for r in range(2)] == ["cuda:0", "cuda:1"]
    assert plain.learner_device("cpu", 1) == "cpu"
    monkeypatch.setattr(per_gpu, "cuda_device_count", lambda: 4)
    on_cuda = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, device="cuda"))
    per_gpu.check_gpus(on_cuda)
    assert on_cuda.parallel.collective_backend("cuda") == "nccl" and plain.collective_backend("cpu") == "gloo"
    shared = dataclasses.replace(on_cuda.parallel, learner_devices="cuda:0,cuda:0")
    assert shared.shares_gpus("cuda") and shared.collective_backend("cuda") == "gloo"
    monkeypatch.setattr(per_gpu, "cuda_device_count", lambda: 1)
    per_gpu.check_gpus(dataclasses.replace(on_cuda, parallel=shared))  # two ranks on the one GPU
    monkeypatch.setattr(per_gpu, "cuda_device_count", lambda: 4)
    for changes, words in (
        ({"learner_devices": "cuda:4,cuda:1"}, "one of the 4 visible GPUs"),
        ({"learner_devices": "cuda:3,cuda:3", "dist_world": 2, "dist_init": "tcp://h:1"}, "a GPU of its own"),
    ):
        bad = dataclasses.replace(on_cuda, parallel=dataclasses.replace(on_cuda.parallel, **changes))
        with pytest.raises(ConfigError, match=words):
            per_gpu.check_gpus(bad)


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_two_learner_ranks_learn_cartpole_and_report_each_sample_once(tmp_path, shm_dir, mode):
    """Two ranks on the CPU (gloo): CartPole reaches 475 within the env-step budget, the samples they trained are
    counted once (the books balance, trained = the learner's samples), rank 1 says so in the log, and nothing of
    the run is left (its shared memory and the ranks' rendezvous file)."""
    result = run_train(
        CARTPOLE
        + ["--mode", mode, "--experiment", "ranks", "--shm_dir", shm_dir, "--stop_at_return", "475"]
        + ["--train_for_env_steps", "3000000", "--train_for_seconds", "300"],
        tmp_path,
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_json(tmp_path / "ranks" / "summary.json")
    assert summary["episode_return_mean"] >= 475, summary["episode_return_mean"]
    books = books_balance(summary)
    assert books["trained"] == summary["learner_samples"] > 0.8 * summary["env_steps"], books
    log = (tmp_path / "ranks" / "train.log").read_text()
    assert re.search(r"learner\[1\] INFO ready: rank 1 of 2 on cpu", log), log[-2000:]
    assert "rank 0 of 2 on cpu" in log
    assert os.listdir(shm_dir) == [], "the run's shared memory or the ranks' rendezvous file was left behind"


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_two_dqn_ranks_each_fill_a_buffer_of_their_own_learn_and_book_every_step_once(tmp_path, shm_dir, mode):
    """DQN with two ranks: each inserts its share of the slots into a buffer of its own (half --replay_size) and
    samples minibatches of half --batch_size from it, the ranks keep the run's replay ratio together, CartPole's
    return rises well above a random policy's (about 22) within 60,000 env steps (1 learner and 2 ranks reached 190
    to 255 in sync mode), and rank 0 reports every rank's inserts once: the books balance."""
    result = run_train(
        CARTPOLE
        + ["--algo", "dqn", "--mode", mode, "--experiment", "dqn", "--shm_dir", shm_dir]
        + ["--train_for_env_steps", "60000", "--replay_size", "40000"],
        tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_json(tmp_path / "dqn" / "summary.json")
    assert summary["episode_return_mean"] >= 100, summary["episode_return_mean"]
    books = books_balance(summary)
    assert books["inserted_replay"] + books["not_trainable"] == summary["replay_inserted_env_steps"], books
    assert abs(summary["replay_ratio"] - summary["replay_ratio_target"]) < 0.5, summary["replay_ratio"]
    assert summary["replay_fill"] == 1.0  # 60,000 env steps through buffers of 20,000 each: both full
    log = (tmp_path / "dqn" / "train.log").read_text()
    assert re.search(r"learner\[1\] INFO ready: rank 1 of 2 on cpu", log), log[-2000:]
    assert os.listdir(shm_dir) == []


@pytest.mark.e2e
@pytest.mark.parametrize(
    "algo, env, flags",
    [
        ("sac", "Pendulum-v1", ["--hidden_size", "32", "--normalize_input", "true"] + REPLAY_SHORT),
        ("td3", "Pendulum-v1", ["--hidden_size", "32"] + REPLAY_SHORT),
        ("qrdqn", "CartPole-v1", REPLAY_SHORT),
        ("r2d2", "CartPole-v1", REPLAY_SHORT),
        ("pqn", "CartPole-v1", ["--train_for_env_steps", "40000"]),
        ("crossq", "Pendulum-v1", ["--hidden_size", "32", "--compile", "false"] + REPLAY_SHORT),
    ],
)
def test_every_other_algorithm_built_for_ranks_trains_with_two(tmp_path, shm_dir, algo, env, flags):
    """Each trains with two ranks: updates taken on both (their weights compared after every round, CrossQ's running
    statistics of its batch renormalizations with them: a difference would stop the run), none skipped, the books
    balanced."""
    result = run_train(
        ["--algo", algo, "--env", env, "--num_learners", "2", "--seed", "1", "--experiment", algo]
        + ["--shm_dir", shm_dir]
        + flags,
        tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_json(tmp_path / algo / "summary.json")
    assert summary["learner_version"] >= 2 and summary["updates_skipped_non_finite"] == 0, summary
    books_balance(summary)
    assert os.listdir(shm_dir) == []


@pytest.mark.e2e
def test_batch_per_learner_makes_the_training_batch_n_times_as_large(tmp_path):
    """By default --batch_size x --num_batches_per_epoch is the run's training batch, split over the ranks; with
    --batch_per_learner it is each rank's, so a round (one published version in sync mode) takes twice the env
    steps."""
    per_version = {}
    for per_learner in ("false", "true"):
        experiment = f"batch_{per_learner}"
        result = run_train(
            CARTPOLE
            + ["--mode", "sync", "--experiment", experiment, "--batch_per_learner", per_learner]
            + ["--num_workers", "1", "--num_envs_per_worker", "64", "--rollout", "16"]
            + ["--batch_size", "512", "--num_batches_per_epoch", "2", "--train_for_env_steps", "40000"],
            tmp_path,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        summary = read_json(tmp_path / experiment / "summary.json")
        per_version[per_learner] = summary["env_steps"] / summary["learner_version"]
        assert summary["learner_samples"] == summary["env_step_books"]["trained"]
    assert 900 < per_version["false"] < 1200 and 1900 < per_version["true"] < 2300, per_version


@pytest.mark.e2e
def test_a_killed_learner_rank_restarts_every_rank_from_the_kept_state(tmp_path, shm_dir):
    """SIGKILL of rank 1: rank 0's collective ends (no hang), both ranks start again from the training state kept,
    at the version published, and the run ends on its env-step budget with its books balanced."""
    exp = str(tmp_path / "kill")
    args = CARTPOLE + ["--shm_dir", shm_dir, "--train_for_env_steps", "1500000", "--train_for_seconds", "200"]
    proc = start_train(args + ["--collective_timeout_sec", "30"], tmp_path, "kill")
    rows = wait_for_children(exp, 4)
    wait_for_steps(exp, 100_000)
    deadline = time.monotonic() + 60  # the training state kept once (every second, after a round) before the kill
    while not any(name.endswith(TRAINING_STATE_SUFFIX) for name in os.listdir(shm_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(next(r["pid"] for r in rows if r["role"] == "learner" and r["index"] == 1), signal.SIGKILL)
    wait_for(exp, "learner_restarts", 1, timeout=90)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    summary = read_json(os.path.join(exp, "summary.json"))
    assert summary["learner_restarts"] == 1 and summary["env_steps"] >= 1_500_000
    books_balance(summary)
    log = open(os.path.join(exp, "train.log")).read()
    assert re.search(r"learner rank 1 of the same learner died \(killed by SIGKILL\)|learner 1 on env \S+ died", log)
    assert "with the training state of version" in log, "the ranks started again from scratch"
    assert len(re.findall(r"learner\[1\] INFO ready: rank 1 of 2", log)) == 2
    assert os.listdir(shm_dir) == []


@pytest.mark.e2e
def test_a_killed_dqn_rank_restarts_every_rank_with_their_buffers_and_every_insert_booked_once(tmp_path, shm_dir):
    """SIGKILL of rank 1 of a DQN run: the ranks start again from the kept state with the buffers they had filled
    (in the run's shared memory), and rank 0's reports count every rank's inserts once across the restart: the books
    balance."""
    exp = str(tmp_path / "kill")
    args = CARTPOLE + ["--algo", "dqn", "--shm_dir", shm_dir, "--train_for_env_steps", "120000"]
    proc = start_train(args + ["--train_for_seconds", "200"], tmp_path, "kill")
    rows = wait_for_children(exp, 4)
    wait_for_steps(exp, 20_000)
    deadline = time.monotonic() + 60  # the training state kept once before the kill
    while not any(name.endswith(TRAINING_STATE_SUFFIX) for name in os.listdir(shm_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(next(r["pid"] for r in rows if r["role"] == "learner" and r["index"] == 1), signal.SIGKILL)
    wait_for(exp, "learner_restarts", 1, timeout=90)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    summary = read_json(os.path.join(exp, "summary.json"))
    assert summary["learner_restarts"] == 1 and summary["env_steps"] >= 120_000
    books = books_balance(summary)
    assert books["inserted_replay"] + books["not_trainable"] == summary["replay_inserted_env_steps"], books
    assert "with the training state of version" in open(os.path.join(exp, "train.log")).read()
    assert os.listdir(shm_dir) == []


@pytest.mark.e2e
def test_checkpoints_of_two_ranks_resume_with_one_and_back(tmp_path):
    """Rank 0 writes the checkpoints as one learner does: a 2-rank run resumes with one learner and that one's
    checkpoint with two, each from the version the last one saved."""
    common = ["--env", "CartPole-v1", "--experiment", "resume", "--seed", "2"]
    versions, steps = [], 100_000
    for ranks in (2, 1, 2):
        result = run_train(common + ["--num_learners", str(ranks), "--train_for_env_steps", str(steps)], tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        summary = read_json(tmp_path / "resume" / "summary.json")
        versions.append(summary["learner_version"])
        # 100,000 env steps more each time: the budget is checked every quarter second, so a run passes its own
        steps = summary["env_steps"] + 100_000
    log = (tmp_path / "resume" / "train.log").read_text()
    resumed = {
        rank: [int(v) for v in re.findall(rf"learner\[{rank}\] INFO policy 0 resumed from \S+ \(version (\d+)\)", log)]
        for rank in (0, 1)
    }
    assert resumed == {0: versions[:2], 1: versions[1:2]}, (resumed, versions)
    assert versions[0] < versions[1] < versions[2]


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--num_learners", "0"], "--num_learners must be at least 1"),
        (["--num_learners", "2", "--algo", "dqn", "--save_replay", "true"], "each rank's replay buffer is its own"),
        (["--num_learners", "4", "--algo", "dqn", "--replay_size", "300"], "one trajectory slot for each of"),
        (["--num_learners", "2", "--mode", "serial"], "--mode serial runs every role in one process"),
        (["--num_learners", "2", "--num_policies", "2"], "the ranks train one policy"),
        (["--num_learners", "2", "--sampling_only", "true"], "trains nothing"),
        (["--num_learners", "3", "--batch_size", "1024", "--rollout", "16", "--num_envs_per_worker", "16"], "multiple"),
        (["--num_learners", "2", "--collective_timeout_sec", "0"], "--collective_timeout_sec must be > 0"),
        (["--num_learners", "2", "--collective_timeout_sec", "60"], "must be below --stuck_timeout_sec (60)"),
        (["--num_learners", "2", "--pool_every_versions", "10"], "the opponent pool is not built for ranks"),
        (["--num_learners", "2", "--env", "TorchCartPole-v1"], "is a device env"),
        (["--num_learners", "2", "--learner_devices", "cpu"], "1 devices for --num_learners 2: give one per rank"),
        (["--num_learners", "2", "--learner_devices", "cuda:0,cuda:1"], "the run is on the CPU (--device cpu)"),
    ],
)
def test_what_several_learner_ranks_do_not_run_is_refused_in_one_line(tmp_path, flags, words):
    result = run_train(["--env", "CartPole-v1", "--train_for_env_steps", "1000"] + flags, tmp_path, timeout=120)
    assert words in one_line_error(result)
    assert not os.path.exists(tmp_path / "default"), "a refused run wrote its experiment directory"
