"""Host arrays to the run's device. On CUDA through pinned (page-locked) host memory with non-blocking
copies: the copy engine reads pinned memory directly, and the host goes on while it does. On the CPU the
arrays become tensors without a copy where they can."""

from __future__ import annotations

import numpy as np
import torch


def torch_dtype(dtype) -> torch.dtype:
    """The torch dtype of numpy's `dtype`."""
    return torch.from_numpy(np.empty(0, dtype)).dtype


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """`array` (strided or not) as a contiguous tensor on `device`. On CUDA it is copied once, into pinned memory
    (torch's caching host allocator, which keeps the block until its copy is done), then to the device without
    blocking; on the CPU a contiguous array is not copied at all."""
    if device.type != "cuda":
        return torch.from_numpy(np.ascontiguousarray(array)).to(device)
    pinned = torch.empty(array.shape, dtype=torch_dtype(array.dtype), pin_memory=True)
    np.copyto(pinned.numpy(), array)
    return pinned.to(device, non_blocking=True)


class PinnedRows:
    """The policy worker's observation gather: rows [slot, row] of shared arrays [slots, rows, E, *shape],
    gathered on CUDA straight into pinned staging arrays (one host copy, not two) and copied without blocking.
    The caller waits on the device before the next gather (its results come back to the host), so one staging
    array per key serves every batch. `most` is the most requests a batch holds."""

    def __init__(self, device: torch.device, most: int):
        self.device, self.most = device, most
        self._staging: dict[str, torch.Tensor] = {}

    def gather(self, key: str, array: np.ndarray, slots: np.ndarray, rows: np.ndarray) -> torch.Tensor:
        """[len(slots) * E, *shape] on the device: array[slots[i], rows[i]] for each request i, in order."""
        n = len(slots)
        if self.device.type != "cuda" or n > self.most:
            batch = array[slots[0], rows[0]] if n == 1 else array[slots, rows].reshape(-1, *array.shape[3:])
            return to_device(batch, self.device)
        staging = self._staging.get(key)
        if staging is None:
            staging = torch.empty((self.most, *array.shape[2:]), dtype=torch_dtype(array.dtype), pin_memory=True)
            self._staging[key] = staging
        flat = array.reshape(array.shape[0] * array.shape[1], *array.shape[2:])  # a view of shared memory
        # mode "clip" (the indices are valid): "raise" would write a temporary first, then copy it into `out`
        np.take(flat, slots * array.shape[1] + rows, axis=0, out=staging.numpy()[:n], mode="clip")
        return staging[:n].reshape(-1, *array.shape[3:]).to(self.device, non_blocking=True)
