"""What the checks for non-finite numbers cost, in microseconds per call, against what they guard, at an
env's default flags on this machine:

- a rollout worker's checks of one batched env step in the common case, every value finite
  (sf_engine.roles.non_finite.zero_non_finite over the float observations and over the rewards, as
  _record calls it), against that env step alone (the envs of one split stepped with random actions; a
  worker's whole cycle per step is longer, so `worker_share` is an upper bound);
- the learner's checks of one training iteration (sf_engine.algo.base.all_finite over the flat weights
  before the publish, and over each minibatch update's loss stats and gradient norm; the batch's
  `non_finite` steps counted), against PPO's training iteration on a batch of the default size.

  python perf/nonfinite_cost.py --env CartPole-v1
  python perf/nonfinite_cost.py --env Pong-v5
One JSON line last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import numpy as np
import torch


def per_call_us(fn, calls: int, repeats: int = 5) -> float:
    """The best of `repeats` means over `calls` calls, in microseconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def worker_figures(plan) -> dict:
    from sf_engine.envs import make_batch_env
    from sf_engine.roles.non_finite import zero_non_finite

    cfg, spec = plan.cfg, plan.spec
    envs = cfg.sampler.envs_per_split
    env = make_batch_env(cfg.env.env, cfg.env.env_backend, envs, seed=0, spec=spec)
    env.reset()
    actions = np.zeros((envs, *spec.action.buffer_shape), spec.action.dtype)
    step_us = per_call_us(lambda: env.step(actions), 200 if envs > 64 else 50)
    obs = {key: np.zeros((envs, *shape), dtype) for key, shape, dtype in spec.obs}
    rewards = np.zeros(envs, np.float32)
    float_keys = [key for key, _, dtype in spec.obs if dtype == "float32"]
    check_us = per_call_us(
        lambda: (zero_non_finite((rewards,)), zero_non_finite([obs[key] for key in float_keys])), 20000
    )
    env.close()
    return {"envs_per_split": envs, "env_step_us": round(step_us, 1), "worker_check_us": round(check_us, 2)}


def learner_figures(plan) -> dict:
    from sf_engine.algo.base import TrainingHooks, all_finite
    from sf_engine.algo.batch import TrajectoryBatch
    from sf_engine.algo.ppo.learning import PPO

    cfg, spec = plan.cfg, plan.spec
    torch.set_num_threads(cfg.learner.learner_threads)
    hooks = TrainingHooks(env_steps=lambda: 0, beat=lambda: None, stopping=lambda: False, elapsed_sec=lambda: 0.0)
    algorithm = PPO(cfg, spec, torch.device("cpu"), hooks)
    steps, trajectories = cfg.sampler.rollout, cfg.slots_per_batch * cfg.sampler.envs_per_split
    flags = lambda: torch.zeros(steps, trajectories, dtype=torch.bool)  # noqa: E731
    n = spec.action.nvec[0] if spec.action.nvec else 2  # behaviour log-probs of a uniform policy
    batch = TrajectoryBatch(
        obs={
            key: torch.zeros(steps + 1, trajectories, *shape, dtype=getattr(torch, dtype))
            for key, shape, dtype in spec.obs
        },
        actions=torch.zeros(steps, trajectories, *spec.action.buffer_shape, dtype=getattr(torch, spec.action.dtype)),
        log_probs=torch.full((steps, trajectories), -float(np.log(n))),
        values=torch.zeros(steps, trajectories),
        policy_version=torch.zeros(steps, trajectories, dtype=torch.int64),
        rewards=torch.rand(steps, trajectories),
        terminated=flags(),
        truncated=flags(),
        valid=~flags(),
        non_finite=flags(),
    )
    batch.keep = batch.valid
    algorithm.train(batch)  # warm-up
    train_sec = []
    for _ in range(3 if trajectories * steps <= 8192 else 1):
        start = time.perf_counter()
        algorithm.train(batch)
        train_sec.append(time.perf_counter() - start)
    figures = torch.zeros(6)
    updates = cfg.learner.num_epochs * cfg.learner.num_batches_per_epoch
    weights_us = per_call_us(lambda: all_finite(algorithm.params), 2000)
    update_us = per_call_us(lambda: all_finite(figures), 20000)
    flags_np = np.zeros((cfg.slots_per_batch, steps, cfg.sampler.envs_per_split), bool)
    books_us = per_call_us(lambda: int(torch.from_numpy(flags_np.swapaxes(0, 1).copy()).sum()), 2000)
    check_us = weights_us + updates * update_us + books_us
    return {
        "flat_weights": algorithm.params.numel(),
        "train_iteration_us": round(statistics.median(train_sec) * 1e6, 1),
        "weights_check_us": round(weights_us, 2),
        "update_check_us": round(update_us, 2),
        "updates_per_iteration": updates,
        "books_us": round(books_us, 2),
        "learner_check_us": round(check_us, 2),
        "learner_share": round(check_us / (statistics.median(train_sec) * 1e6), 5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    args, flags = parser.parse_known_args()
    from sf_engine.run.plan import build_plan

    with tempfile.TemporaryDirectory(prefix="sf_engine_perf_") as train_dir:
        plan = build_plan(["--env", args.env, "--train_dir", train_dir, "--device", "cpu"] + flags)
    out = {"bench": "nonfinite_cost", "env": args.env, **worker_figures(plan)}
    out["worker_share"] = round(out["worker_check_us"] / out["env_step_us"], 5)
    out.update(learner_figures(plan))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
