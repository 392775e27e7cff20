"""Command line: --help, one-line errors for bad input before any process starts, the resolved config."""

import argparse
import dataclasses
import json
import os

import pytest
from conftest import files_of, read_json, run_train, train_error

from sf_engine.config.cli import build_parser
from sf_engine.config.groups import flag_groups
from sf_engine.runtime.device import cuda_device_count


@pytest.mark.e2e
def test_help_explains_every_flag(tmp_path):
    result = run_train(["--help"], tmp_path)
    assert result.returncode == 0
    for flag in (
        "--env",
        "--env_backend",
        "--experiment",
        "--train_dir",
        "--num_workers",
        "--num_envs_per_worker",
        "--worker_num_splits",
        "--rollout",
        "--batch_size",
        "--num_epochs",
        "--learning_rate",
        "--gamma",
        "--gae_lambda",
        "--device",
        "--mode",
        "--with_vtrace",
        "--max_policy_lag",
        "--seed",
        "--train_for_env_steps",
        "--train_for_seconds",
        "--stop_at_return",
        "--save_every_sec",
        "--rnn",
        "--rnn_size",
        "--recurrence",
        "--stuck_timeout_sec",
        "--max_worker_restarts",
    ):
        assert flag in result.stdout, flag


def test_help_prints_every_flags_text_as_written():
    # argparse formats help texts with %: a text with a percent sign in it must still print as written
    parser = build_parser()
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=1_000_000)
    printed = " ".join(parser.format_help().split())
    assert "option_strings" not in printed  # a stray % formats argparse's own fields into the text
    for cls in flag_groups().values():  # every built-in algorithm's own group too
        for fld in dataclasses.fields(cls):
            assert " ".join(fld.metadata["help"].split()) in printed, fld.name


@pytest.mark.parametrize(
    "args, words",
    [
        (["--env", "NoSuchEnv-v0"], ["--env NoSuchEnv-v0", "unknown"]),
        (["--rollout", "1"], ["--rollout", "at least 2"]),
        (["--with_wandb", "--wandb_tags", "ok," + "x" * 65], ["--wandb_tags", "64 characters"]),
        (["--with_wandb", "--wandb_project", "team/project"], ["--wandb_project", "without"]),
        (["--rnn", "gru", "--recurrence", "5"], ["--recurrence", "--rollout"]),
        (["--batch_size", "1000", "--num_envs_per_worker", "128"], ["--batch_size", "multiple"]),
        (["--batch_size", "1000", "--rollout", "48"], ["--batch_size", "--rollout"]),
        (["--num_envs_per_worker", "7", "--worker_num_splits", "2"], ["--num_envs_per_worker", "--worker_num_splits"]),
        pytest.param(
            ["--device", "cuda"],
            ["--device cuda", "--device cpu"],
            marks=pytest.mark.skipif(cuda_device_count() > 0, reason="this host has a GPU"),
        ),
        (
            [
                "--rollout",
                "100000",
                "--num_workers",
                "1",
                "--num_envs_per_worker",
                "20000",
                "--batch_size",
                "1000000000",
            ],
            ["MiB", "--num_envs_per_worker"],
        ),
        (["--mode", "sync", "--batch_size", "65536", "--num_batches_per_epoch", "8"], ["--mode sync", "--batch_size"]),
        (["--learning_rate", "nan"], ["--learning_rate", "finite"]),
        (["--train_for_seconds", "inf"], ["--train_for_seconds", "finite"]),
        (["--ppo_clip_ratio", "0"], ["--ppo_clip_ratio", "positive"]),
        (["--save_every_sec", "-1"], ["--save_every_sec", "positive"]),
        (["--entropy_coeff", "-0.1"], ["--entropy_coeff", ">= 0"]),
        (["--experiment", "../outside"], ["--experiment", "plain name"]),
        (["--experiment=-x"], ["--experiment", "plain name"]),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(tmp_path, shm_dir, args, words, capsys):
    line = train_error(["--shm_dir", shm_dir] + args, tmp_path, capsys)
    for word in words:
        assert word in line
    assert os.listdir(shm_dir) == []
    assert os.listdir(tmp_path) == []  # found while building the plan: nothing on disk was created


@pytest.mark.e2e
def test_bf16_without_native_bf16_is_one_line(tmp_path, monkeypatch, capsys):
    import sf_engine.run.plan

    monkeypatch.setattr(sf_engine.run.plan, "cpu_has_native_bf16", lambda: False)
    line = train_error(["--bf16", "--device", "cpu", "--mode", "serial"], tmp_path, capsys)
    assert "--bf16" in line and "avx512_bf16" in line
    assert os.listdir(tmp_path) == []


def test_bad_flag_value_is_rejected_by_the_parser(tmp_path):
    result = run_train(["--mode", "fast"], tmp_path)
    assert result.returncode == 2 and "--mode" in result.stderr


def test_resuming_with_another_model_is_refused(tmp_path, shm_dir, capsys):
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    base = [
        "--experiment",
        "resume",
        "--mode",
        "serial",
        "--shm_dir",
        shm_dir,
        "--num_workers",
        "1",
        "--num_envs_per_worker",
        "8",
        "--batch_size",
        "256",
        "--train_for_env_steps",
        "3000",
    ]
    assert run(build_plan(base + ["--train_dir", str(tmp_path)])) == 0
    saved = read_json(tmp_path / "resume" / "config.json")
    assert "auto" not in json.dumps(saved)  # the resolved plan, not the flags
    assert saved["command_line"][-2:] == ["--train_dir", str(tmp_path)] and saved["model"]["rnn_size"] == 64
    before = files_of(tmp_path / "resume")
    line = train_error(base + ["--hidden_size", "32", "--train_for_env_steps", "6000"], tmp_path, capsys)
    assert "--hidden_size was 64, now 32" in line and "--restart" in line
    assert line.index("choose another --experiment") < line.index("--restart to delete that run's checkpoints")
    assert files_of(tmp_path / "resume") == before  # refused before anything on disk changed
    assert run(build_plan(base + ["--hidden_size", "32", "--restart", "--train_dir", str(tmp_path)])) == 0


def test_bad_input_against_an_existing_experiment_changes_nothing(tmp_path, shm_dir, capsys):
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    base = [
        "--experiment",
        "kept",
        "--mode",
        "serial",
        "--shm_dir",
        shm_dir,
        "--num_workers",
        "1",
        "--num_envs_per_worker",
        "8",
        "--batch_size",
        "256",
        "--train_for_env_steps",
        "3000",
    ]
    assert run(build_plan(base + ["--train_dir", str(tmp_path)])) == 0
    before = files_of(tmp_path)
    bad = [
        (["--restart", "--learning_rate", "-1"], "--learning_rate"),
        (["--restart", "--adam_eps", "0"], "--adam_eps"),
        (["--restart", "--rollout", "1"], "--rollout"),
    ]
    if cuda_device_count() == 0:
        bad.append((["--restart", "--device", "cuda"], "--device cuda"))  # once deleted every checkpoint
    for args, words in bad:
        assert words in train_error(base + args, tmp_path, capsys)
        assert files_of(tmp_path) == before
    (tmp_path / "kept" / "config.json").write_text("{not json")
    before = files_of(tmp_path)
    line = train_error(base, tmp_path, capsys)
    assert "config.json is unreadable" in line and "--restart" in line and files_of(tmp_path) == before
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    assert "is a file" in train_error(base[:2] + ["--train_dir", str(not_a_dir / "sub")] + base[2:], tmp_path, capsys)


def test_config_reruns_a_saved_run_with_the_flags_given_winning(tmp_path, shm_dir, capsys):
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    first = [
        "--experiment",
        "first",
        "--mode",
        "serial",
        "--shm_dir",
        shm_dir,
        "--num_workers",
        "1",
        "--num_envs_per_worker",
        "8",
        "--batch_size",
        "256",
        "--hidden_size",
        "32",
        "--gamma",
        "0.97",
        "--train_for_env_steps",
        "2000",
        "--train_dir",
        str(tmp_path),
        "--restart",
    ]
    assert run(build_plan(first)) == 0
    saved = str(tmp_path / "first" / "config.json")
    plan = build_plan(["--config", saved, "--experiment", "second", "--gamma", "0.9"])
    old, new = read_json(saved), plan.cfg.to_dict()
    assert new["learner"]["gamma"] == 0.9 and new["run"]["experiment"] == "second"  # the flags given win
    assert new["model"] == old["model"] and new["sampler"] == old["sampler"]  # the rest from the file
    assert new["run"]["restart"] is False and new["run"]["train_dir"] == "train_dir"  # never taken from the file
    bad = tmp_path / "bad.json"
    for text, words in (
        ("{not json", "cannot be read"),
        ('{"learner": {"gamma": "high"}}', "learner.gamma"),
        ('{"learner": {"no_such_flag": 1}}', "unknown setting"),
    ):
        bad.write_text(text)
        assert words in train_error(["--config", str(bad)], tmp_path, capsys)


def test_console_scripts_are_installed_and_sf_engine_is_the_only_top_level_name(tmp_path):
    import subprocess
    import sys
    from importlib.metadata import entry_points

    from sf_engine.play import enjoy as replay
    from sf_engine.run import runner

    scripts = {ep.name: ep for ep in entry_points(group="console_scripts")}
    assert scripts["sf-train"].load() is runner.main and scripts["sf-enjoy"].load() is replay.main
    for name in ("train", "enjoy", "envs"):  # generic names another package could own: never installed
        result = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=tmp_path, capture_output=True)
        assert result.returncode != 0
    # the repository's envs/ folder is installed as sf_engine.envs
    result = subprocess.run([sys.executable, "-c", "from sf_engine.envs import make_batch_env"], cwd=tmp_path)
    assert result.returncode == 0


@pytest.mark.parametrize(
    "text",
    [
        '{"run": {"mode": null}}',
        '{"learner": {"num_epochs": true}}',
        '{"learner": {"batch_size": "1024"}}',
        '{"env": {"env": ["CartPole-v1"]}}',
        '{"model": {"normalize_input": "yes"}}',
        '{"sampler": {"rollout": 3.5}}',
    ],
)
def test_config_values_of_the_wrong_type_are_refused(tmp_path, text, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    assert "is not a valid" in train_error(["--config", str(bad)], tmp_path / "runs", capsys)


def test_a_choice_by_its_former_name_is_read_as_its_name_now(tmp_path, shm_dir):
    """--weight_init's 'ppo' is 'scaled' now: from the command line, train()'s keywords, a --config file, and the
    config.json of an experiment it ran in, which resumes as the same model."""
    from sf_engine.config.cli import given_of_values
    from sf_engine.run.plan import build_plan
    from sf_engine.run.runner import run

    base = ["--experiment", "old", "--mode", "serial", "--shm_dir", shm_dir, "--train_dir", str(tmp_path)]
    base += ["--num_workers", "1", "--num_envs_per_worker", "8", "--batch_size", "256"]
    plan = build_plan(base + ["--weight_init", "ppo", "--train_for_env_steps", "2000"])
    assert plan.cfg.model.weight_init == "scaled"
    assert given_of_values({"weight_init": "ppo"})["model"]["weight_init"] == "scaled"
    assert run(plan) == 0
    config = tmp_path / "old" / "config.json"
    saved = read_json(config)
    assert saved["model"]["weight_init"] == "scaled"
    saved["model"]["weight_init"] = "ppo"  # as a run of an earlier version wrote it
    config.write_text(json.dumps(saved))
    resumed = build_plan(base + ["--train_for_env_steps", "4000"])  # the same model: no refusal
    assert resumed.resume_from is not None and resumed.cfg.model.weight_init == "scaled"
    rerun = build_plan(["--config", str(config), "--experiment", "new", "--train_dir", str(tmp_path)])
    assert rerun.cfg.model.weight_init == "scaled"
