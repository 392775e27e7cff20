"""SAC's learner cost: updates per second at batch 256 on HalfCheetah-v5's shapes (17 observations, 6 actions,
256 x 2 ReLU networks), ours against Stable-Baselines3 2.9.2's in the same run, each alone on the machine.

  python perf/sac_updates.py                    # ours with the compiled MLP kernels and with torch ops, then SB3
  python perf/sac_updates.py --threads 2 --no_baseline

Ours: sf_engine.algo.sac.learning.SAC.train on random minibatches as the replay buffer gives them (the learner's step
without sampling). SB3: SAC('MlpPolicy').train(gradient_steps, 256) over a replay buffer of random transitions,
in its own venv (../shared/baselines/sb3.sh makes it; $SB3_BASELINE_VENV or ~/.cache/sb3-baseline-venv).
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
from stable_baselines3 import SAC
from stable_baselines3.common.logger import configure
torch.set_num_threads(int(sys.argv[1]))
updates = int(sys.argv[2])
model = SAC("MlpPolicy", gym.make("HalfCheetah-v5"), batch_size=256, learning_starts=0, device="cpu", seed=0)
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


def ours(updates: int, use_kernels: bool) -> float:
    from sf_engine.algo.base import TrainingHooks
    from sf_engine.algo.batch import ReplayBatch
    from sf_engine.algo.sac.learning import SAC
    from sf_engine.model import kernels
    from sf_engine.run.plan import build_plan

    with tempfile.TemporaryDirectory() as train_dir:
        plan = build_plan(["--algo", "sac", "--env", "HalfCheetah-v5", "--train_dir", train_dir, "--mode", "serial"])
    hooks = TrainingHooks(env_steps=lambda: 0, beat=lambda: None, stopping=lambda: False, elapsed_sec=lambda: 0.0)
    torch.manual_seed(0)
    sac = SAC(plan.cfg, plan.spec, torch.device("cpu"), hooks)
    rng = np.random.default_rng(0)
    (key, shape, _), rows = plan.spec.obs[0], 256

    def batch() -> ReplayBatch:
        return ReplayBatch(
            obs={key: torch.from_numpy(rng.normal(size=(rows, *shape)).astype(np.float32))},
            actions=torch.from_numpy(rng.uniform(-1, 1, (rows, 6)).astype(np.float32)),
            returns=torch.from_numpy(rng.normal(size=rows).astype(np.float32)),
            discounts=torch.full((rows,), 0.99),
            next_obs={key: torch.from_numpy(rng.normal(size=(rows, *shape)).astype(np.float32))},
            weights=torch.ones(rows),
        )

    batches = [batch() for _ in range(16)]
    saved = kernels.KERNELS
    kernels.KERNELS = saved if use_kernels else None
    try:
        for i in range(20):
            sac.train(batches[i % 16])
        start = time.perf_counter()
        for i in range(updates):
            sac.train(batches[i % 16])
        return updates / (time.perf_counter() - start)
    finally:
        kernels.KERNELS = saved


def sb3(updates: int, threads: int) -> float:
    venv = os.environ.get("SB3_BASELINE_VENV", os.path.expanduser("~/.cache/sb3-baseline-venv"))
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        raise SystemExit(f"no Stable-Baselines3 venv at {venv}: run ../shared/baselines/sb3.sh once to make it")
    out = subprocess.run(
        [python, "-c", SB3_SNIPPET, str(threads), str(updates)], capture_output=True, text=True, timeout=900
    )
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--updates", type=int, default=1000, help="updates timed per measurement")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each (SB3 trains in one by default)")
    p.add_argument("--no_baseline", action="store_true", help="skip Stable-Baselines3")
    args = p.parse_args()
    from sf_engine.model import kernels

    torch.set_num_threads(args.threads)
    result = {"threads": args.threads, "batch_size": 256, "env": "HalfCheetah-v5"}
    if kernels.KERNELS is not None:
        result["ours_kernels_updates_per_sec"] = round(ours(args.updates, True), 1)
    result["ours_torch_updates_per_sec"] = round(ours(args.updates, False), 1)
    best = max(v for k, v in result.items() if k.startswith("ours_"))
    if not args.no_baseline:
        result["sb3_updates_per_sec"] = round(sb3(args.updates, args.threads), 1)
        result["ratio_vs_sb3"] = round(best / result["sb3_updates_per_sec"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
