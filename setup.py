import ctypes
import os
import platform

from setuptools import setup


def compiled_extensions() -> dict:
    """The compiled kernels (sf_engine/csrc): the recurrent core's loops, and an MLP's forward and backward,
    the discrete PPO loss and prioritized replay's sum tree on the CPU, built when torch is importable here
    (`pip install --no-build-isolation`, as the Makefile does) and a C++ compiler works; without them
    sf_engine runs the same maths as torch ops and NumPy (slower)."""
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        return {}
    import torch

    try:  # the BLAS torch calls, if its library exports it (CPU builds with MKL do)
        libtorch = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        direct_blas = hasattr(libtorch, "sgemm_") and hasattr(libtorch, "dgemm_")
    except OSError:
        direct_blas = False
    libc, version = platform.libc_ver()
    glibc = tuple(int(v) for v in version.split(".")[:2] if v.isdigit()) if libc == "glibc" else ()
    vector_tanh = platform.machine() == "x86_64" and glibc >= (2, 35)  # glibc's libmvec has tanh
    flags = ["-O3", "-fno-math-errno", f"-DSF_DIRECT_BLAS={int(direct_blas)}", f"-DSF_VECTOR_TANH={int(vector_tanh)}"]
    link = ["-lmvec"] if vector_tanh else []
    sources = {"_recurrent_loops": ["recurrent_loops.cpp"], "_cpu_kernels": ["cpu_kernels.cpp", "sum_tree.cpp"]}
    extensions = [
        CppExtension(
            f"sf_engine.model.{name}",
            [f"sf_engine/csrc/{source}" for source in files],
            extra_compile_args=flags,
            extra_link_args=link,
            optional=True,
        )
        for name, files in sources.items()
    ]
    return {"ext_modules": extensions, "cmdclass": {"build_ext": BuildExtension.with_options(use_ninja=False)}}


# The metadata, dependencies, extras and console scripts are in pyproject.toml; this file adds the
# compiled extension, which needs the installed torch at build time.
setup(**compiled_extensions())
