"""Checkpoints: written by the learner atomically (temp file, fsync, rename), newest found by name.

File name `checkpoint_v{version:09d}_s{env_steps:013d}.pt`, so the runner can read the env-step
count of a run to resume without importing torch.
"""
from __future__ import annotations

import glob
import os
import re

_NAME = re.compile(r"checkpoint_v(\d+)_s(\d+)\.pt$")
BEST_NAME = "best.pt"  # the weights with the best evaluation return (written by the evaluator)


def checkpoint_dir(experiment_dir: str) -> str:
    return os.path.join(experiment_dir, "checkpoints")


def list_checkpoints(directory: str) -> list[str]:
    """Checkpoint paths, oldest first."""
    paths = [p for p in glob.glob(os.path.join(directory, "checkpoint_*.pt")) if _NAME.search(p)]
    return sorted(paths, key=lambda p: tuple(int(x) for x in _NAME.search(p).groups()))


def latest_checkpoint(directory: str):
    paths = list_checkpoints(directory)
    return paths[-1] if paths else None


def env_steps_of(path) -> int:
    return int(_NAME.search(path).group(2)) if path else 0


def save_state_atomic(path: str, state: dict) -> None:
    """torch.save to a temporary file, fsync, rename: a reader sees the old file or the new one."""
    import torch

    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(directory: str, state: dict, version: int, env_steps: int, keep: int) -> str:
    """Write `state` atomically and keep only the newest `keep` checkpoints."""
    path = os.path.join(directory, f"checkpoint_v{version:09d}_s{env_steps:013d}.pt")
    save_state_atomic(path, state)
    for old in list_checkpoints(directory)[:-keep]:
        os.unlink(old)
    return path


def load_checkpoint(path: str, device="cpu") -> dict:
    import torch

    return torch.load(path, map_location=device, weights_only=False)
