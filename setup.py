from setuptools import find_packages, setup

setup(
    name="sf_engine",
    version="0.1.0",
    description="Single-node, high-throughput, shared-memory reinforcement learning (asynchronous PPO / V-trace)",
    packages=find_packages(include=["sf_engine", "sf_engine.*", "envs", "envs.*"]),
    py_modules=["train", "enjoy"],
    python_requires=">=3.9",
    install_requires=[
        "torch>=2.1",
        "numpy",
        "gymnasium[classic-control]>=1.0",
        "envpool>=0.8",
        "faster-fifo>=1.4",
        "psutil",
        "tensorboard",
        "imageio",
        "imageio-ffmpeg",
    ],
    extras_require={"test": ["pytest"], "perf": ["matplotlib"]},
)
