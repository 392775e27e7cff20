"""What prioritized replay costs in a learner step at the DQN defaults: one learner step as the learner's replay
feed takes it (sample a minibatch, copy it to tensors, one DQN update, the new priorities), timed with uniform and
with prioritized sampling over a full buffer, in this one process on one thread.

  python perf/replay_cost.py                           # CartPole-v1 (classic control defaults)
  python perf/replay_cost.py --env Breakout-v5         # Atari defaults (Nature CNN, batch 32)
  python perf/replay_cost.py --tree numpy              # the sum tree's NumPy way (default: compiled where built)

Prints one JSON line last: the median microseconds of a learner step with uniform and with prioritized replay,
the sampling structure's own part (sampling, weights and priority updates: prioritized minus uniform), and that
part's share of a prioritized learner step (`per_share`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sf_engine.algo.base import TrainingHooks  # noqa: E402
from sf_engine.algo.dqn.learning import DQN  # noqa: E402
from sf_engine.config.algorithms import algorithm_spec  # noqa: E402
from sf_engine.config.cli import make_config  # noqa: E402
from sf_engine.envs import flag_defaults, probe_env_spec  # noqa: E402
from sf_engine.model.shape import resolve_model_config  # noqa: E402
from sf_engine.replay.buffer import ReplayBuffer  # noqa: E402
from sf_engine.replay.layout import REPLAY_FILLED, replay_layout, replay_prefix  # noqa: E402
from sf_engine.replay.sum_tree import SumTree  # noqa: E402
from sf_engine.replay.transitions import NStepTransitions  # noqa: E402


def full_buffer(cfg, spec, prioritized: bool, capacity: int, tree: str | None = None) -> ReplayBuffer:
    """A buffer of `capacity` transitions (the family's rollout per column) full of random trainable data; `tree`:
    the sum tree's way ('compiled', 'numpy'; None: compiled where built)."""
    cfg = dataclasses.replace(
        cfg, replay=dataclasses.replace(cfg.replay, replay_size=capacity, prioritized=prioritized)
    )
    rng = np.random.default_rng(0)
    arrays = {}
    for name, (shape, dtype) in replay_layout(cfg, spec).items():
        short = name.removeprefix(replay_prefix(0))
        arrays[short] = (rng.random(shape) * 255).astype(dtype) if dtype != "bool" else np.ones(shape, bool)
    arrays["steps"][:] = 1
    arrays["actions"][:] = rng.integers(0, spec.action.nvec[0], arrays["actions"].shape)
    arrays["discounts"][:] = 0.99
    arrays["counters"][:] = 0
    arrays["counters"][REPLAY_FILLED] = arrays["returns"].shape[0]
    if prioritized:
        arrays["priorities"][:] = 0
    buffer = ReplayBuffer(arrays, NStepTransitions(0.99, cfg.replay.n_step), prioritized, cfg.replay.per_alpha, seed=0)
    if prioritized:
        if tree is not None:
            buffer.tree = SumTree(buffer.capacity, arrays["priorities"], compiled=tree == "compiled")
        leaves = np.arange(buffer.capacity)
        buffer.tree.update(leaves, rng.random(buffer.capacity) + 0.01)
    return buffer


def step_times(algo, buffer: ReplayBuffer, batch: int, seconds: float) -> list:
    """Microseconds of each learner step over `seconds` (after a warm-up)."""
    tensor = torch.from_numpy  # the learner's device here is the CPU
    times = []
    deadline = time.perf_counter() + seconds + 0.5
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        sample = buffer.sample(batch, 0.5)
        result = algo.train(buffer.transform.batch(sample, tensor, discrete=True))
        buffer.update_priorities(sample.indices, result.priorities.numpy())
        times.append((time.perf_counter() - started) * 1e6)
    return times[len(times) // 10 :]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--capacity", type=int, default=None, help="transitions (default: the family's --replay_size)")
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement, alternating, 3 rounds")
    parser.add_argument("--tree", choices=("compiled", "numpy"), default=None, help="the sum tree's way")
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = probe_env_spec(args.env, "auto")
    defaults = flag_defaults(spec) | algorithm_spec("dqn").env_defaults(args.env, spec)
    cfg = make_config({"learner": {"algo": "dqn"}}, defaults)
    cfg = dataclasses.replace(cfg, model=resolve_model_config(cfg.model, spec))
    capacity = args.capacity or cfg.replay.replay_size
    hooks = TrainingHooks(lambda: 0, lambda: None, lambda: False, lambda: 0.0)
    algo = DQN(cfg, spec, torch.device("cpu"), hooks)
    buffers = {flag: full_buffer(cfg, spec, flag, capacity, args.tree) for flag in (False, True)}
    times = {False: [], True: []}
    for _ in range(3):
        for flag in (False, True):
            times[flag] += step_times(algo, buffers[flag], cfg.learner.batch_size, args.seconds / 3)
    uniform, prioritized = statistics.median(times[False]), statistics.median(times[True])
    print(
        json.dumps(
            {
                "env": args.env,
                "batch_size": cfg.learner.batch_size,
                "capacity": buffers[True].capacity,
                "learner_step_uniform_us": round(uniform, 1),
                "learner_step_prioritized_us": round(prioritized, 1),
                "per_us": round(prioritized - uniform, 1),
                "per_share": round((prioritized - uniform) / prioritized, 4),
                "sum_tree": "compiled" if buffers[True].tree.compiled else "numpy",
                "threads": 1,
            }
        )
    )


if __name__ == "__main__":
    main()
