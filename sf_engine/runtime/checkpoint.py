"""Checkpoints: written by the learner atomically (temp file, fsync, rename) with a checksum, newest
found by name; a corrupt or truncated file is skipped for the one before it.

A checkpoint holds tensors and plain data only (dicts, lists, numbers, strings) and is read with
torch's weights-only unpickler: a file from elsewhere that carries anything else (a pickled callable,
say) is refused before any of it runs. The checksum checks integrity, not origin.

File name `checkpoint_v{version:09d}_s{env_steps:013d}.pt`, so the runner can read the env-step
count of a run to resume without importing torch. File contents: torch.save bytes, then a trailer of
MAGIC and the SHA-256 of those bytes.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import io
import os
import re

_NAME = re.compile(r"checkpoint_v(\d+)_s(\d+)\.pt$")
BEST_NAME = "best.pt"  # the weights with the best evaluation return (written by the evaluator)
MAGIC = b"SFENGINE-SHA256:"
_TRAILER = len(MAGIC) + 32


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (truncated, corrupted, not a checkpoint)."""


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


def read_verified(path: str) -> bytes:
    """The torch.save bytes of a checkpoint whose checksum matches; CheckpointError otherwise."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise CheckpointError(f"{path} cannot be read ({exc.strerror})") from None
    body, trailer = data[:-_TRAILER], data[-_TRAILER:]
    if len(data) < _TRAILER or not trailer.startswith(MAGIC):
        raise CheckpointError(f"{path} is truncated or corrupted (no checksum at its end)")
    if hashlib.sha256(body).digest() != trailer[len(MAGIC) :]:
        raise CheckpointError(f"{path} is truncated or corrupted (checksum mismatch)")
    return body


def latest_valid_checkpoint(directory: str, load: bool = False):
    """(path of the newest checkpoint whose checksum matches or None, [(skipped path, reason), ...]).
    `load`: it must also load (tensors and plain data only, see load_checkpoint)."""
    skipped = []
    for path in reversed(list_checkpoints(directory)):
        try:
            load_checkpoint(path) if load else read_verified(path)
            return path, skipped
        except CheckpointError as exc:
            skipped.append((path, str(exc)))
    return None, skipped


def remove_temporary_files(directory: str) -> None:
    """Half-written checkpoints of a run that was killed while saving."""
    for path in glob.glob(os.path.join(directory, "*.tmp")):
        os.unlink(path)


def save_state_atomic(path: str, state: dict, durable: bool = True) -> None:
    """torch.save with a checksum to a temporary file, fsync (where `durable`: a file that must outlive a crash
    of the machine, not only of a process), rename: a reader sees the old file or the new one. On an OSError
    (disk full, ...) the temporary file is removed and the old file stays."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = state_bytes(state)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(body)
            f.write(MAGIC + hashlib.sha256(body).digest())
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_checkpoint(directory: str, state: dict, version: int, env_steps: int, keep: int) -> str:
    """Write `state` atomically, read it back, then keep `keep` checkpoints: the one just written and the
    newest `keep` - 1 others by name. Nothing is removed before the new file is read back whole (OSError
    otherwise, the file removed), and the new file is never rotated away (a run resumed from an older
    checkpoint, its newest being corrupt, writes versions older than that one)."""
    path = os.path.join(directory, f"checkpoint_v{version:09d}_s{env_steps:013d}.pt")
    save_state_atomic(path, state)
    try:
        read_verified(path)
    except CheckpointError as exc:
        os.unlink(path)
        raise OSError(errno.EIO, f"the checkpoint read back is not what was written: {exc}") from None
    others = [old for old in list_checkpoints(directory) if old != path]
    for old in others[: max(0, len(others) - (keep - 1))]:
        os.unlink(old)
    return path


def load_checkpoint(path: str, device="cpu") -> dict:
    """A checkpoint's state after checking its checksum, read with torch's weights-only unpickler
    (tensors and plain data; nothing in the file can run code). CheckpointError when the checksum
    does not match or the file holds anything else."""
    return state_of_bytes(read_verified(path), device, path)


def state_bytes(state: dict) -> bytes:
    """A training state as torch.save's bytes (a checkpoint's body; what learner rank 0 sends the others)."""
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def state_of_bytes(body: bytes, device, source: str) -> dict:
    """The state of state_bytes' `body`, read with torch's weights-only unpickler (tensors and plain data: nothing
    in it can run code); CheckpointError naming `source` where it holds anything else or does not load."""
    import pickle

    import torch

    try:
        return torch.load(io.BytesIO(body), map_location=device, weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"{source} holds more than tensors and plain data: refused, as loading it could run code"
        ) from None
    except Exception as exc:
        raise CheckpointError(f"{source} cannot be loaded ({exc.__class__.__name__})") from None


# The state a checkpoint holds: one policy's ({model, optimizer, version, ...}, the algorithm's state and
# its version) or a population's ({policies: [one such state each], version: their sum}); the learner's
# PBT and opponent-pool state and the run's config beside it. These two functions are the one place
# that knows the two shapes apart.


def policy_states(state: dict) -> list:
    """Each policy's state in a checkpoint's `state`, in policy order (one for a one-policy checkpoint)."""
    return state["policies"] if state.get("policies") else [state]


def population_state(states: list) -> dict:
    """The checkpoint state of the policies' `states` (each holding its "version"): one policy's own, or
    the whole population in one state (a resumed run finds every policy as it was together)."""
    if len(states) == 1:
        return dict(states[0])
    return {"policies": states, "version": sum(state["version"] for state in states)}
