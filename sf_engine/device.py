"""Device selection. `cuda_device_count()` asks the CUDA driver directly, so the runner can validate
--device before any process starts without importing torch."""
from __future__ import annotations

import ctypes


def cuda_device_count() -> int:
    """GPUs the CUDA driver sees (0 when there is no driver)."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if libcuda.cuInit(0) != 0 or libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def resolve_device(device: str):
    """'auto' -> CUDA when torch sees a GPU, else CPU. Runs in the policy worker and learner."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)
