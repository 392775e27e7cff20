import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_train(args, train_dir, timeout=180, **kwargs):
    """Run train.py as a user would; returns the CompletedProcess."""
    cmd = [sys.executable, os.path.join(REPO, "train.py"), "--train_dir", str(train_dir)] + list(args)
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, **kwargs)


def one_line_error(result) -> str:
    """The promised failure of a script: exit code 2 and exactly one 'error: ...' line on stderr."""
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def read_json(path):
    with open(path) as f:
        return json.load(f)


@pytest.fixture
def shm_dir(tmp_path):
    """A private directory (on the same tmpfs as /dev/shm) for a run's shared segment, so a test can see
    that nothing is left behind."""
    path = os.path.join("/dev/shm", f"sf_engine_test_{os.getpid()}_{tmp_path.name}")
    os.makedirs(path)
    yield path
    for name in os.listdir(path):
        os.unlink(os.path.join(path, name))
    os.rmdir(path)
