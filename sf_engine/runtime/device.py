"""Device selection, decided once in the main process: `cuda_device_count()` asks the CUDA driver
directly, so a run without a GPU never imports torch for it."""

from __future__ import annotations

import ctypes
import os
import shutil
import sys


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


def resolve_device(device: str) -> str:
    """--device 'auto' -> 'cuda' when the driver and torch both see a GPU (torch is imported only then),
    else 'cpu'. ValueError (one line naming the flag and the fix) for 'cuda' without a GPU."""
    if device == "cuda" and cuda_device_count() == 0:
        raise ValueError("--device cuda: no CUDA GPU is available here; use --device cpu (or auto)")
    if device != "auto":
        return device
    if cuda_device_count() == 0:
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (avx512_bf16 or AMX), from /proc/cpuinfo (Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpp_compiler() -> str | None:
    """The C++ compiler torch.compile would call (its inductor's: $CXX, else g++, clang++ on macOS), where it is on
    PATH; None where it is not, and torch.compile would fail at its first call."""
    return shutil.which(os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++"))


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep large blocks it frees, for the next allocation of the same size.

    By default glibc serves every block above its mmap threshold (at most 32 MiB) with a fresh mmap
    and unmaps it on free, so each large tensor of a training step (a Pong minibatch's images and
    conv activations are 30 to 60 MiB) costs the kernel's page faults and zeroing all over again:
    a third of a Pong learner step on the CPU. With mmap off for malloc and the heap's top trimmed
    only past 1 GiB, freed blocks are reused. Called by the processes that run torch; a no-op
    (False) where the C library is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30))
    except (OSError, AttributeError):
        return False
