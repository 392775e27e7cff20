"""What one learner step costs (on the CPU, or the GPU with `-- --device cuda`), alone: the real Learner (the
run plan's model, optimizer and training batch) trains over and over on trajectory slots filled with plausible
data, without sampling, so nothing else competes for the cores.

  python perf/learner_step.py                          # CartPole-v1 defaults, 1 worker x 256 envs
  python perf/learner_step.py --profile 20             # + torch's profiler: where the time goes, op by op
  python perf/learner_step.py -- --rnn lstm            # flags after -- go to the run plan
Prints one JSON line: learner samples/s (samples trained per second of train_on, each sample
--num_epochs times), per core (divided by --learner_threads), and the split of a step into
batch_assembly / train / weight_publish; with --profile the top ops by self CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def fill(buffers, spec, rng) -> None:
    """Plausible slots: random observations and actions, a few episode ends, every step trainable."""
    for key, array in buffers.obs.items():
        array[...] = rng.integers(0, 256, array.shape) if array.dtype == np.uint8 else rng.normal(size=array.shape)
    action = spec.action
    if action.kind == "continuous":
        buffers.actions[...] = rng.normal(size=buffers.actions.shape)
    else:
        buffers.actions[...] = rng.integers(0, min(action.nvec), buffers.actions.shape)
    buffers.log_probs[...] = -0.7 + 0.1 * rng.normal(size=buffers.log_probs.shape)
    buffers.values[...] = rng.normal(size=buffers.values.shape)
    buffers.rewards[...] = 1.0
    buffers.terminated[...] = rng.random(buffers.terminated.shape) < 0.01
    buffers.truncated[...] = False
    buffers.valid[...] = True
    buffers.policy_version[...] = 0
    if buffers.episode_start is not None:  # an episode starts on the step after one ends
        buffers.episode_start[:, 0] = False
        buffers.episode_start[:, 1:] = buffers.terminated
        buffers.rnn_states[...] = 0.0


def build(flags: list, shm_dir: str):
    from sf_engine.run.plan import build_plan
    from sf_engine.runtime.role import RoleContext, set_torch_threads
    from sf_engine.runtime.shared_buffers import SharedBuffers
    from sf_engine.runtime.wiring import make_queues

    train_dir = tempfile.mkdtemp(prefix="sf_engine_learner_step_")  # checked by the plan, never written
    os.rmdir(train_dir)
    plan = build_plan(
        [
            "--mode",
            "serial",
            "--num_workers",
            "1",
            "--num_envs_per_worker",
            "256",
            "--device",
            "cpu",
            "--train_dir",
            train_dir,
            "--shm_dir",
            shm_dir,
            "--experiment",
            "learner_step",
        ]
        + flags
    )
    buffers = SharedBuffers.create(plan.paths.shm_path, plan.layout)
    queues = make_queues(plan.cfg.sampler.num_workers, None, None)
    set_torch_threads("learner", plan.cfg)
    from sf_engine.roles.learner import Learner

    learner = Learner(RoleContext(plan, "learner", 0, buffers, queues))
    return plan, buffers, queues, learner


def train_step(learner, queues, slots: list) -> None:
    """One learner step on the filled `slots`, as the learner's loop takes it."""
    from sf_engine.runtime.ipc import get_many

    learner.version = 0  # every sample stays within --max_policy_lag
    learner.train_on(slots)
    get_many(queues.free_slots, 0)  # the slots handed back, and the stats sent, are dropped here
    get_many(queues.stats, 0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--steps", type=int, default=30, help="Timed training steps (after 3 warm-up steps).")
    parser.add_argument("--profile", type=int, default=0, help="Also profile this many steps op by op.")
    parser.add_argument("--top", type=int, default=15, help="Ops listed from the profile.")
    args, extra = parser.parse_known_args()
    flags = [x for x in extra if x != "--"]
    from sf_engine.stats.stages import StageTimer

    plan, buffers, queues, learner = build(flags, "/dev/shm")
    try:
        rng = np.random.default_rng(0)
        cfg = plan.cfg
        slots = list(range(cfg.slots_per_batch))
        fill(buffers, plan.spec, rng)

        def step():
            train_step(learner, queues, slots)

        for _ in range(3):
            step()
        learner.timer = StageTimer(*learner.timer.stage_sec)
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        wall = time.perf_counter() - start
        stages = learner.timer.stage_sec
        samples = args.steps * cfg.train_batch
        out = {
            "bench": "learner_step",
            "env": cfg.env.env,
            "device": cfg.run.device,
            "rnn": cfg.model.rnn,
            "threads": cfg.learner.learner_threads,
            "batch": cfg.train_batch,
            "minibatch": cfg.learner.batch_size,
            "epochs": cfg.learner.num_epochs,
            "steps": args.steps,
            "step_ms": round(1000 * wall / args.steps, 2),
            "learner_samples_per_sec": round(samples / wall),
            "learner_samples_per_sec_per_core": round(samples / wall / cfg.learner.learner_threads),
            "stage_share": {k: round(v / wall, 3) for k, v in stages.items() if v},
            "flags": flags,
        }
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            on_gpu = cfg.run.device.startswith("cuda")
            with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * on_gpu) as prof:
                for _ in range(args.profile):
                    step()
            averages = prof.key_averages()
            if on_gpu:  # the GPU's busy time against the step's: well under it, the step is bound by the host
                busy = sum(getattr(e, "self_device_time_total", 0) for e in averages) / args.profile / 1000
                out["gpu_busy_ms_per_step"] = round(busy, 2)
            total = sum(e.self_cpu_time_total for e in averages)
            top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[: args.top]
            out["profile_top_ops"] = [
                {
                    "op": e.key,
                    "self_share": round(e.self_cpu_time_total / total, 3),
                    "calls_per_step": round(e.count / args.profile, 1),
                }
                for e in top
            ]
            print(averages.table(sort_by="self_cpu_time_total", row_limit=args.top), file=sys.stderr)
        print(json.dumps(out))
    finally:
        buffers.release()


if __name__ == "__main__":
    main()
