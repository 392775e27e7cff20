"""docs/api.md's walk-through of an algorithm of one's own, run as it is written there: its module taken from the
docs into a temporary directory, trained from there with its own flag, and replayed."""

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, read_json

MARKER = "<!-- walk-through: reinforce.py -->"


def walkthrough_module() -> str:
    """The code block after the marker in docs/api.md."""
    text = open(os.path.join(REPO, "docs", "api.md")).read()
    assert MARKER in text, "docs/api.md has no walk-through"
    return re.search(r"```python\n(.*?)```", text[text.index(MARKER) :], re.S).group(1)


@pytest.mark.e2e
def test_the_documented_algorithm_trains_from_a_directory_of_its_own(tmp_path, shm_dir):
    (tmp_path / "reinforce.py").write_text(walkthrough_module())
    command = [sys.executable, os.path.join(REPO, "train.py"), "--algo", "reinforce:SPEC", "--entropy_bonus", "0.02"]
    command += ["--mode", "serial", "--train_dir", "runs", "--shm_dir", shm_dir, "--train_for_env_steps", "150000"]
    out = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    summary = read_json(tmp_path / "runs" / "default" / "summary.json")
    assert summary["episode_return_mean"] > 50, summary["episode_return_mean"]  # a random policy's is about 22
    assert read_json(tmp_path / "runs" / "default" / "config.json")["reinforce"] == {"entropy_bonus": 0.02}
    replay = [sys.executable, os.path.join(REPO, "enjoy.py"), "--train_dir", "runs", "--num_episodes", "2"]
    played = subprocess.run(replay, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert played.returncode == 0 and '"episodes": 2' in played.stdout, played.stdout[-2000:] + played.stderr[-2000:]
