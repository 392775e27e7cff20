"""What one env step, one inference and one training sample cost on this machine, measured in a moment (well under
a second) by the main process for auto sizing (sf_engine.run.autosize): an env step's wall and CPU time, less the
time the probe waited for a core on a busy machine (Linux's schedstat), and the cores other processes kept busy; an
inference's and a training sample's CPU time, the model built as the run will build it.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass

import numpy as np

PROBE_SEC = 0.25
LEARN_PROBE_ELEMENTS = 2_000_000


@dataclass
class Costs:
    """Seconds per env step of one env (wall and CPU, measured in a batch; the wall less the time the probe waited
    for a core, so that a busy machine does not make a CPU-bound env look like one that waits) and CPU seconds per
    sample of inference and of training (all epochs)."""

    env_wall: float
    env_cpu: float
    inference: float
    learn: float
    env_bytes: float = 0.0  # resident memory of one env (measured on the probe's batch)
    queued: float = 0.0  # seconds per env step the probe waited for a core (other processes had them)
    others_busy: float = 0.0  # cores other processes kept busy during the probe


def _run_delay() -> float:
    """Seconds this process's threads have waited on a run queue for a core (Linux's schedstat), 0 elsewhere."""
    total = 0.0
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/schedstat") as f:
                total += int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0
    return total


def _others_busy_cores(busy_before: float, own_cpu: float, wall: float) -> float:
    """Cores kept busy by other processes over `wall` seconds: the machine's busy CPU seconds since `busy_before`
    (psutil) less this process's `own_cpu`."""
    import psutil

    return max(0.0, (_machine_busy(psutil) - busy_before - own_cpu) / max(wall, 1e-9))


def _machine_busy(psutil) -> float:
    """CPU seconds all cores spent busy since boot (everything but idle and I/O wait)."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _timed(fn, min_sec: float, min_reps: int = 3) -> tuple[float, float, int]:
    """Run fn until min_sec and min_reps are both reached; (wall, cpu, reps)."""
    wall0, cpu0, reps = time.perf_counter(), time.process_time(), 0
    while reps < min_reps or time.perf_counter() - wall0 < min_sec:
        fn()
        reps += 1
    return time.perf_counter() - wall0, time.process_time() - cpu0, reps


def _probe_actions(spec, obs: dict):
    """observation -> random actions for the probe's next step: legal ones of that observation where the env
    masks actions; else one of 8 batches drawn up front from the reset observation `obs`, in turn, so that
    drawing them is not timed as env stepping."""
    from sf_engine.envs.masks import random_actions

    rng = np.random.default_rng(0)
    if spec.action_mask:
        return lambda latest: random_actions(spec, latest, rng)
    drawn = itertools.cycle([random_actions(spec, obs, rng) for _ in range(8)])
    return lambda latest: next(drawn)


@dataclass
class EnvCost:
    """What one env step cost the probe: wall seconds (less the time it waited for a core), CPU seconds, the seconds
    it waited for a core; and the cores other processes kept busy meanwhile."""

    wall: float
    cpu: float
    queued: float
    others_busy: float


def measure_env(cfg, spec, num_envs: int) -> tuple[EnvCost, dict, float]:
    """What one env step costs (one env, stepped in a batch of num_envs); one reset obs batch; the resident memory
    one env takes (this process's growth while the batch is made and stepped)."""
    import psutil

    from sf_engine.envs import make_batch_env

    before = psutil.Process().memory_info().rss
    env = make_batch_env(cfg.env.env, cfg.env.env_backend, num_envs, seed=cfg.env.seed + 7_777_777, spec=spec)
    try:
        obs = {key: np.array(value) for key, value in env.reset().items()}
        actions_for, latest = _probe_actions(spec, obs), [obs]

        def step():
            latest[0] = env.step(actions_for(latest[0])).obs

        step()  # first steps may allocate
        delay, busy = _run_delay(), _machine_busy(psutil)
        wall, cpu, reps = _timed(step, PROBE_SEC)
        queued = min(max(0.0, _run_delay() - delay), wall - min(cpu, wall))
        others = _others_busy_cores(busy, cpu, wall)
        env_bytes = max(0, psutil.Process().memory_info().rss - before) / num_envs
    finally:
        env.close()
    steps = reps * num_envs
    return EnvCost((wall - queued) / steps, min(cpu, wall) / steps, queued / steps, others), obs, env_bytes


def measure_model(cfg, spec, obs: dict, batch: int) -> tuple[float, float]:
    """CPU seconds per sample of acting (policy worker, 1 thread) and of training (forward, backward and
    optimizer step on a minibatch, learner threads, times the epochs or the replay ratio; with dqn and r2d2
    also the targets' forwards on the next observations). CPU time, not wall time: the forkserver may be busy
    on the other cores meanwhile."""
    import torch

    from sf_engine.algo.acting import build_policy
    from sf_engine.model.acting import ActContext
    from sf_engine.model.actor_critic import obs_tensors
    from sf_engine.model.flat_state import FlatAdam, flatten_state

    def tiled(rows: int) -> dict:  # the probe's reset observations repeated to `rows` samples
        reps = -(-rows // len(next(iter(obs.values()))))
        return obs_tensors({k: np.concatenate([v] * reps)[:rows] for k, v in obs.items()})

    threads = torch.get_num_threads()
    model = build_policy(spec, cfg, cfg.run.bf16)  # as the policy worker and learner will run it
    model.refresh_bf16_acting()
    inputs = tiled(batch)
    try:
        torch.set_num_threads(1)
        state = model.initial_state(batch)
        with torch.inference_mode():
            acting = ActContext(training=True, version=1)  # as the policy worker acts once learning started
            model.act(inputs, state, acting)
            _, cpu, n = _timed(lambda: model.act(inputs, state, acting), PROBE_SEC / 2)
        inference = cpu / (n * batch)
        torch.set_num_threads(cfg.learner.learner_threads)
        # big enough that per-call overhead does not count, small enough to take a moment with a CNN
        elements = sum(v[0].numel() for v in inputs.values())
        minibatch = max(16, min(cfg.learner.batch_size, LEARN_PROBE_ELEMENTS // elements))
        train_inputs = tiled(minibatch)
        optimizer = FlatAdam(model, flatten_state(model), lr=1e-6, eps=1e-5)  # the learner's optimizer

        forward = _probe_forward(model, train_inputs, minibatch)
        # the targets' forwards (DQN's: the target network, and with double Q the online one, on the next observations)
        bootstrap_forwards = cfg.algorithm.extra_forwards(cfg)

        def train_step():
            with torch.no_grad():
                for _ in range(bootstrap_forwards):
                    forward()
            params, values = forward()
            loss = params.square().mean() + values.square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        train_step()
        _, cpu, n = _timed(train_step, PROBE_SEC / 2)
    finally:
        torch.set_num_threads(threads)
    reuse = cfg.replay.replay_ratio if cfg.uses_replay else cfg.learner.num_epochs  # samples trained per env step
    return inference, cpu / (n * minibatch) * reuse


def _probe_forward(model, inputs: dict, minibatch: int):
    """The learner's forward of `model` over the probe's `inputs` -> (distribution parameters, values): the acting
    contract's `outputs`; a built-in recurrent core unrolled over [minibatch / 16, 16] steps and sequences, as the
    learner runs it."""
    import torch

    if not model.recurrent or not hasattr(model, "forward_sequence"):
        state = model.initial_state(minibatch)
        return lambda: model.outputs(inputs, state)[:2]
    sequence = (minibatch // 16, 16)
    steps = sequence[0] * sequence[1]

    def forward():
        params, values, _ = model.forward_sequence(
            {k: v[:steps] for k, v in inputs.items()},
            model.initial_state(sequence[1]),
            torch.zeros(sequence, dtype=torch.bool),
        )
        return params, values

    return forward


def measure(cfg, spec, probe_envs: int) -> Costs:
    env, obs, env_bytes = measure_env(cfg, spec, probe_envs)
    inference, learn = measure_model(cfg, spec, obs, batch=max(probe_envs, 64))
    learn = 0.0 if cfg.run.sampling_only else learn
    return Costs(env.wall, env.cpu, inference, learn, env_bytes, queued=env.queued, others_busy=env.others_busy)
