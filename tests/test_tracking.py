"""--with_wandb: the TensorBoard scalars and the config reach Weights & Biases (offline here), a resumed
experiment continues its W&B run, and a W&B refusal or a missing package is one line that changes
nothing."""

import glob
import json
import os

import pytest
from conftest import files_of, one_line_error, read_json, run_train, train_error
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

_BLOCK = 32768  # the record log's block size (LevelDB's log format, after W&B's 7-byte header)


def wandb_records(path) -> list:
    """The records of a W&B run file (run-<id>.wandb) in the order they were written."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", path
    pos, pieces, records = 7, b"", []
    while pos + 7 <= len(data):
        if _BLOCK - pos % _BLOCK < 7:  # too little left in a block for a record header: padding
            pos += _BLOCK - pos % _BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        pieces += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            records.append(record)
            pieces = b""
    return records


def _logged(records) -> tuple:
    """(the run record, [{metric: value}] of every history row) of a W&B run file."""
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    rows = [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    return run, rows


@pytest.mark.e2e
def test_wandb_gets_the_tensorboard_scalars_and_the_config_and_resumes_its_run(tmp_path, shm_dir):
    offline = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    base = [
        "--experiment",
        "tracked",
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
        "--with_wandb",
        "--wandb_project",
        "demo",
        "--wandb_group",
        "smoke",
        "--wandb_tags",
        "cartpole, short",
    ]
    first = run_train(base + ["--train_for_env_steps", "3000"], tmp_path, env=offline)
    assert first.returncode == 0, first.stdout + first.stderr
    exp = tmp_path / "tracked"
    files = glob.glob(str(exp / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1
    run, rows = _logged(wandb_records(files[0]))
    assert (run.project, run.run_group, list(run.tags), run.display_name) == (
        "demo",
        "smoke",
        ["cartpole", "short"],
        "tracked",
    )
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert {key: config[key] for key in read_json(exp / "config.json")} == read_json(exp / "config.json")
    events = EventAccumulator(str(exp))
    events.Reload()
    tensorboard_tags = set(events.Tags()["scalars"])
    assert len(tensorboard_tags) > 10 and tensorboard_tags <= set().union(*rows)
    summary = read_json(exp / "summary.json")
    assert rows[-1]["env_steps"] == summary["env_steps"]
    assert rows[-1]["train/version"] == summary["learner_version"]

    # the same experiment again: its W&B run goes on, the steps after the first run's
    second = run_train(base + ["--train_for_env_steps", "6000"], tmp_path, env=offline)
    assert second.returncode == 0, second.stdout + second.stderr
    files = sorted(glob.glob(str(exp / "wandb" / "offline-run-*" / "run-*.wandb")))
    assert len(files) == 2 and {os.path.basename(f) for f in files} == {f"run-{run.run_id}.wandb"}
    earlier, later = ([row["env_steps"] for row in _logged(wandb_records(f))[1]] for f in files)
    assert min(later) >= max(earlier) and max(later) == read_json(exp / "summary.json")["env_steps"] >= 6000

    # online without a W&B login: refused in one line, before anything of the experiment changes
    before = files_of(tmp_path)
    home = tmp_path.parent / "home"
    home.mkdir()
    online = {key: value for key, value in offline.items() if not key.startswith("WANDB_")}
    refused = run_train(
        base + ["--train_for_env_steps", "9000"], tmp_path, env={**online, "HOME": str(home), "WANDB_MODE": "online"}
    )
    line = one_line_error(refused)
    assert "--with_wandb" in line and "wandb login" in line and "WANDB_MODE=offline" in line
    assert files_of(tmp_path) == before


def test_with_wandb_without_the_package_is_one_line_with_the_install_command(tmp_path, monkeypatch, capsys):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    line = train_error(["--with_wandb", "--mode", "serial"], tmp_path, capsys)
    assert "--with_wandb" in line and "pip install 'sf_engine[wandb]'" in line
    assert os.listdir(tmp_path) == []
