"""The replay actor-critics' learner cost: updates per second at batch 256 on HalfCheetah-v5's shapes (17 observations,
6 actions, 256 x 2 ReLU networks), SAC's or TD3's, on the CPU or the GPU, eager and with --compile; against
Stable-Baselines3 2.9.2's in the same run, each alone on the machine.

  python perf/sac_updates.py                    # SAC: ours with the compiled MLP kernels and with torch ops, then SB3
  python perf/sac_updates.py --threads 2 --no_baseline
  python perf/sac_updates.py --algo td3 --device cpu cuda --compile both --no_baseline   # the GPU against the CPU

Ours: the algorithm's `train` (sf_engine.algo.sac / td3) on random minibatches as the replay buffer gives them (the
learner's step without sampling; --compile's first updates, which compile, are not timed). SB3: SAC('MlpPolicy')
or TD3('MlpPolicy').train(gradient_steps, 256) over a replay buffer of random transitions, on the CPU, in its own
venv (../shared/baselines/sb3.sh makes it; $SB3_BASELINE_VENV or ~/.cache/sb3-baseline-venv).
Prints one JSON line: updates/s of each and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

SB3_SNIPPET = """
import sys, time, numpy as np, torch, gymnasium as gym
import stable_baselines3
from stable_baselines3.common.logger import configure
torch.set_num_threads(int(sys.argv[1]))
updates = int(sys.argv[2])
algo = getattr(stable_baselines3, sys.argv[3].upper())
model = algo("MlpPolicy", gym.make("HalfCheetah-v5"), batch_size=256, learning_starts=0, device="cpu", seed=0)
model.set_logger(configure(None, []))
rng = np.random.default_rng(0)
for _ in range(5000):
    obs, nxt = rng.normal(size=(1, 17)).astype(np.float32), rng.normal(size=(1, 17)).astype(np.float32)
    model.replay_buffer.add(obs, nxt, rng.uniform(-1, 1, (1, 6)).astype(np.float32), rng.normal(size=1),
                            np.zeros(1), [{}])
model.train(gradient_steps=20, batch_size=256)
start = time.perf_counter()
model.train(gradient_steps=updates, batch_size=256)
print(updates / (time.perf_counter() - start))
"""


def ours(algo: str, updates: int, device: str, use_kernels: bool, compile_on: bool) -> float:
    from sf_engine.algo.base import TrainingHooks
    from sf_engine.algo.batch import ReplayBatch
    from sf_engine.config.algorithms import import_class
    from sf_engine.model import kernels
    from sf_engine.run.plan import build_plan

    flags = ["--algo", algo, "--env", "HalfCheetah-v5", "--mode", "serial", "--compile", str(compile_on)]
    with tempfile.TemporaryDirectory() as train_dir:
        plan = build_plan(flags + ["--train_dir", train_dir, "--device", device])
    hooks = TrainingHooks(env_steps=lambda: 0, beat=lambda: None, stopping=lambda: False, elapsed_sec=lambda: 0.0)
    torch.manual_seed(0)
    learner = import_class(plan.cfg.algorithm.learner)(plan.cfg, plan.spec, torch.device(device), hooks)
    rng = np.random.default_rng(0)
    (key, shape, _), rows = plan.spec.obs[0], 256

    def batch() -> ReplayBatch:
        def floats(*size, low=None):
            values = rng.normal(size=size) if low is None else rng.uniform(low, 1.0, size)
            return torch.from_numpy(values.astype(np.float32)).to(device)

        return ReplayBatch(
            obs={key: floats(rows, *shape)},
            actions=floats(rows, 6, low=-1.0),
            returns=floats(rows),
            discounts=torch.full((rows,), 0.99, device=device),
            next_obs={key: floats(rows, *shape)},
            weights=torch.ones(rows, device=device),
        )

    batches = [batch() for _ in range(16)]
    saved = kernels.KERNELS
    kernels.KERNELS = saved if use_kernels else None
    try:
        for i in range(20):  # warm-up (and --compile's compiling)
            learner.train(batches[i % 16])
        start = time.perf_counter()
        for i in range(updates):
            learner.train(batches[i % 16])
        return updates / (time.perf_counter() - start)  # each update ends by reading its figures on the host
    finally:
        kernels.KERNELS = saved


def sb3(algo: str, updates: int, threads: int) -> float:
    venv = os.environ.get("SB3_BASELINE_VENV", os.path.expanduser("~/.cache/sb3-baseline-venv"))
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        raise SystemExit(f"no Stable-Baselines3 venv at {venv}: run ../shared/baselines/sb3.sh once to make it")
    out = subprocess.run(
        [python, "-c", SB3_SNIPPET, str(threads), str(updates), algo], capture_output=True, text=True, timeout=900
    )
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", choices=("sac", "td3"), default="sac", help="the algorithm whose updates are timed")
    p.add_argument("--updates", type=int, default=1000, help="updates timed per measurement")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each (SB3 trains in one by default)")
    p.add_argument("--device", nargs="+", choices=("cpu", "cuda"), default=["cpu"], help="ours on each of these")
    p.add_argument("--compile", choices=("off", "on", "both"), default="off", help="ours without --compile, with, both")
    p.add_argument("--no_baseline", action="store_true", help="skip Stable-Baselines3")
    args = p.parse_args()
    from sf_engine.model import kernels

    torch.set_num_threads(args.threads)
    result = {"algo": args.algo, "threads": args.threads, "batch_size": 256, "env": "HalfCheetah-v5"}
    compiles = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    for device in args.device:
        for compile_on in compiles:
            name = f"ours_{device}" + ("_compile" if compile_on else "")
            if device == "cpu" and not compile_on and kernels.KERNELS is not None:
                result[f"{name}_kernels_updates_per_sec"] = round(ours(args.algo, args.updates, device, True, False), 1)
            result[f"{name}_torch_updates_per_sec"] = round(ours(args.algo, args.updates, device, False, compile_on), 1)
    best = max(v for k, v in result.items() if k.startswith("ours_"))
    if not args.no_baseline:
        result["sb3_updates_per_sec"] = round(sb3(args.algo, args.updates, args.threads), 1)
        result["ratio_vs_sb3"] = round(best / result["sb3_updates_per_sec"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
