"""What averaging the gradients over learner ranks costs on the CPU: the learner step of `perf/learner_step.py` (the
run plan's real Learner training over and over on filled trajectory slots, no sampling) with one rank, then with
--ranks ranks joined by gloo (sf_engine.runtime.ranks), each on the same per-rank batch and its own data, every
optimizer's gradient all-reduced and averaged before each step.

  python perf/allreduce_cost.py                        # CartPole-v1, PPO's defaults, 1 then 2 ranks
  python perf/allreduce_cost.py --steps 20 -- --algo pqn   # flags after -- go to the run plan
  python perf/allreduce_cost.py -- --device cuda           # every rank on the one GPU (gloo, through the host)
An algorithm on a replay buffer is refused: its learner step is the replay ratio's, not a batch of slots.

The ranks' weights are compared (a checksum) after every step: a difference stops the benchmark. On a machine of
2 cores two ranks take both, each at --learner_threads (1 by default here). Prints one JSON line: step time with 1
rank and with N, their ratio, the all-reduces and bytes per step.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from learner_step import build, fill, train_step  # noqa: E402


def _rank(rank: int, world: int, init: str, flags: list, steps: int, results) -> None:
    """One rank's timed learner steps (all ranks start together after warm-up), with the checksums compared."""
    from sf_engine.runtime.ranks import RankGroup, checksum

    shm_dir = tempfile.mkdtemp(prefix=f"sf_engine_allreduce_{rank}_", dir="/dev/shm")
    try:
        plan, buffers, queues, learner = build(flags, shm_dir)
        try:
            device = learner.device  # on one GPU every rank's: gloo, as ranks sharing a GPU meet in a run
            group = RankGroup(rank, world, init, device, timeout_sec=120, backend="gloo") if world > 1 else None
            algorithm = learner.policies[0].algorithm
            optimizers = [getattr(algorithm, name) for name in algorithm.holds.optimizers.values()]
            reduced = {"calls": 0, "bytes": 0}

            def average_(tensor):
                reduced["calls"] += 1
                reduced["bytes"] += tensor.numel() * tensor.element_size()
                return group.average_(tensor)

            if group is not None:
                for optimizer in optimizers:
                    optimizer.average = average_
            fill(buffers, plan.spec, np.random.default_rng(rank))  # each rank its own data
            slots = list(range(plan.cfg.slots_per_batch))
            params = learner.policies[0].params

            def step():
                train_step(learner, queues, slots)
                weights = checksum(params)  # with one rank too: the same work (and on a GPU, its wait) in both
                if group is not None and not group.same_everywhere(weights):
                    raise RuntimeError(f"rank {rank}: the ranks' weights differ after a step")

            for _ in range(3):
                step()
            if group is not None:
                group.same_everywhere(0)  # a barrier: the timed steps start together
            reduced.update(calls=0, bytes=0)
            started = time.perf_counter()
            for _ in range(steps):
                step()
            wall = time.perf_counter() - started
            results.put((rank, wall / steps, reduced["calls"] / steps, reduced["bytes"] / steps, plan.cfg))
            if group is not None:
                group.close()
        finally:
            buffers.release()
    except BaseException:
        results.put((rank, traceback.format_exc(), None, None, None))
    finally:
        shutil.rmtree(shm_dir, ignore_errors=True)


def measure(world: int, flags: list, steps: int) -> dict:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    work = tempfile.mkdtemp(prefix="sf_engine_allreduce_")
    init = f"file://{os.path.join(work, 'rendezvous')}"
    processes = [context.Process(target=_rank, args=(r, world, init, flags, steps, results)) for r in range(world)]
    for process in processes:
        process.start()
    try:
        out = [results.get(timeout=1800) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
        shutil.rmtree(work, ignore_errors=True)
    for rank, step_sec, *_ in out:
        if isinstance(step_sec, str):
            raise SystemExit(f"rank {rank} failed:\n{step_sec}")
    slowest = max(out, key=lambda r: r[1])
    return {"step_ms": round(1000 * slowest[1], 2), "all_reduces": slowest[2], "bytes": slowest[3], "cfg": slowest[4]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--steps", type=int, default=20, help="timed learner steps per rank (after 3 warm-up steps)")
    parser.add_argument("--ranks", type=int, default=2, help="ranks of the second measurement (>= 2)")
    args, extra = parser.parse_known_args()
    if args.ranks < 2:
        parser.error(f"--ranks must be at least 2 (got {args.ranks})")
    flags = ["--learner_threads", "1"] + [x for x in extra if x != "--"]
    from sf_engine.run.plan import build_plan

    with tempfile.TemporaryDirectory(prefix="sf_engine_allreduce_") as work:
        if build_plan(flags + ["--train_dir", work, "--mode", "serial"]).cfg.uses_replay:
            parser.error("an algorithm on a replay buffer: its learner step is not a batch of slots (use ppo or pqn)")
    one = measure(1, flags, args.steps)
    many = measure(args.ranks, flags, args.steps)
    cfg = one["cfg"]
    print(
        json.dumps(
            {
                "bench": "allreduce_cost",
                "env": cfg.env.env,
                "algo": cfg.learner.algo,
                "device": cfg.run.device,
                "batch_per_rank": cfg.train_batch,
                "steps": args.steps,
                "one_rank_step_ms": one["step_ms"],
                f"{args.ranks}_ranks_step_ms": many["step_ms"],
                "ratio": round(many["step_ms"] / one["step_ms"], 3),
                "all_reduces_per_step": many["all_reduces"],
                "all_reduce_bytes_per_step": many["bytes"],
                "cores": os.cpu_count(),
                "flags": flags,
            }
        )
    )


if __name__ == "__main__":
    main()
