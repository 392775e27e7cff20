"""Single-process ceiling: one batch of envs and the same policy's forward pass in one loop, no IPC.

  python perf/ceiling.py --env CartPole-v1 --seconds 10
Uses the env family's default model and envs per worker (as train.py would); one torch thread, like a
policy worker. Prints one JSON line: env steps/s on one core, and that figure times the machine's
cores, the ceiling our multi-process sampler is compared with.

  python perf/ceiling.py --env Pong-v5 --env_only --processes 16
The envs alone: random actions, no forward, in --processes processes at once (each its own batch of envs),
the machine's env-only frames/s on those cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--num_envs", type=int, default=None, help="default: the family's envs per worker")
    parser.add_argument("--env_only", action="store_true", help="random actions, no policy forward")
    parser.add_argument("--processes", type=int, default=1, help="--env_only: processes stepping at once")
    args = parser.parse_args()
    if args.env_only:
        return env_only(args)
    import torch

    from sf_engine.model.acting import PLAYING
    from sf_engine.model.actor_critic import ActorCritic, obs_tensors

    torch.set_num_threads(1)
    env, plan, num_envs = _batch_env(args.env, args.num_envs, seed=0)
    spec, model = plan.spec, ActorCritic(plan.spec, plan.cfg.model)
    obs = env.reset()

    def step() -> None:
        nonlocal obs
        obs = env.step(model.act(obs_tensors(obs), None, PLAYING).actions.numpy()).obs

    with torch.inference_mode():
        rate = _steps_per_sec(step, num_envs, args.seconds)
    cores = os.cpu_count()
    print(
        json.dumps(
            {
                "bench": "ceiling",
                "env": args.env,
                "num_envs": num_envs,
                "env_steps_per_sec": round(rate),
                "frames_per_sec": round(rate * spec.frameskip),
                "cores": cores,
                "ceiling_env_steps_per_sec_all_cores": round(rate * cores),
            }
        )
    )


def _batch_env(env_id: str, num_envs, seed: int) -> tuple:
    """(batch env, run plan, envs): `num_envs` of `env_id` (None: the family's envs per worker), as train.py
    would make them."""
    from sf_engine.envs import family, make_batch_env
    from sf_engine.run.plan import build_plan

    plan = build_plan(["--env", env_id, "--mode", "serial", "--restart"])  # --restart: reads no experiment
    num_envs = num_envs or family(plan.spec.family).envs_per_worker
    env = make_batch_env(plan.cfg.env.env, plan.cfg.env.env_backend, num_envs, seed=seed, spec=plan.spec)
    return env, plan, num_envs


def _steps_per_sec(step, num_envs: int, seconds: float) -> float:
    """Env steps/s of `step()` (one step of `num_envs` envs) called over `seconds`, after 2 s of warm-up."""
    steps, start, deadline = 0, time.monotonic(), None
    while True:
        now = time.monotonic()
        if deadline is None and now - start >= 2.0:  # warm-up
            deadline, start, steps = now + seconds, now, 0
        if deadline is not None and now >= deadline:
            break
        step()
        steps += num_envs
    return steps / (time.monotonic() - start)


def _step_envs(env_id: str, num_envs, seconds: float, seed: int, barrier=None) -> tuple:
    """(env steps/s, frameskip, envs) of one batch of `env_id` stepped with random actions; `barrier`: every
    process starts stepping at once, so that their timed windows overlap."""
    import itertools

    import numpy as np

    env, plan, num_envs = _batch_env(env_id, num_envs, seed)
    env.reset()
    if barrier is not None:
        barrier.wait()
    rng, nvec = np.random.default_rng(seed), plan.spec.action.nvec
    actions, turn = [rng.integers(0, nvec[0], num_envs) for _ in range(64)], itertools.count()
    rate = _steps_per_sec(lambda: env.step(actions[next(turn) % 64]), num_envs, seconds)
    return rate, plan.spec.frameskip, num_envs


def env_only(args) -> None:
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(args.processes) as pool:
        barrier = manager.Barrier(args.processes)
        jobs = [(args.env, args.num_envs, args.seconds, i, barrier) for i in range(args.processes)]
        runs = pool.starmap(_step_envs, jobs)
    rate, frameskip, num_envs = sum(r[0] for r in runs), runs[0][1], runs[0][2]
    print(
        json.dumps(
            {
                "bench": "ceiling_env_only",
                "env": args.env,
                "processes": args.processes,
                "num_envs": num_envs,
                "env_steps_per_sec": round(rate),
                "frames_per_sec": round(rate * frameskip),
            }
        )
    )


if __name__ == "__main__":
    main()
