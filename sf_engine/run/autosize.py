"""`--num_workers auto` and `--num_envs_per_worker auto`: size the sampler from the cores and a short
measurement (well under a second) of what one env step, one inference and one training sample cost.

Runs in the main process while it builds the run plan, before the buffers are laid out. The rule is a throughput
balance:
  envs per split  the fewest (dividing the training batch into whole slots, at least the family's hint)
                  whose batched step takes >= TARGET_SPLIT_SEC, so a round trip to the policy worker
                  is a small part of a split's cycle;
  workers         enough that sampling keeps up with what the learner and the policy worker can consume
                  within the cores: workers >= HEADROOM x demand x wall time of one env step (the
                  demand: env steps/s that learning and inference can take); a CPU-bound env gets
                  at most the cores' share left after inference and learning, an env that mostly waits
                  (sleeps, I/O) may get more workers than cores, up to MAX_WORKERS_PER_CORE per core.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from sf_engine.config.groups import ROLLOUT_DEFAULT, ROLLOUT_SHORT

TARGET_SPLIT_SEC = 2e-3
MAX_ENVS_PER_SPLIT = 256
MAX_WORKERS_PER_CORE = 4
HEADROOM = 1.5  # a worker's cycle also holds writing the slot and the round trip to the policy worker
PROBE_SEC = 0.25
LEARN_PROBE_ELEMENTS = 2_000_000
PROCESS_MEMORY_BYTES = 400 * 2**20  # resident memory of one process (torch, libraries) besides buffers and envs
ENV_MEMORY_SHARE = 0.5  # the envs auto sizing builds take at most this share of the memory available


@dataclass
class Costs:
    """Seconds per env step of one env (wall and CPU, measured in a batch) and CPU seconds per sample
    of inference and of training (all epochs)."""

    env_wall: float
    env_cpu: float
    inference: float
    learn: float
    env_bytes: float = 0.0  # resident memory of one env (measured on the probe's batch)


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


def measure_env(cfg, spec, num_envs: int) -> tuple[float, float, dict, float]:
    """Wall and CPU seconds per env step (one env, stepped in a batch of num_envs); one reset obs batch;
    the resident memory one env takes (this process's growth while the batch is made and stepped)."""
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
        wall, cpu, reps = _timed(step, PROBE_SEC)
        env_bytes = max(0, psutil.Process().memory_info().rss - before) / num_envs
    finally:
        env.close()
    steps = reps * num_envs
    return wall / steps, min(cpu, wall) / steps, obs, env_bytes


def measure_model(cfg, spec, obs: dict, batch: int) -> tuple[float, float]:
    """CPU seconds per sample of acting (policy worker, 1 thread) and of training (forward, backward and
    optimizer step on a minibatch, learner threads, times the epochs or the replay ratio; with dqn and r2d2
    also the targets' forwards on the next observations). CPU time, not wall time: the forkserver may be busy
    on the other cores meanwhile."""
    import torch

    from sf_engine.algo.acting import build_policy
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
            model.sample(inputs, state)
            _, cpu, n = _timed(lambda: model.sample(inputs, state), PROBE_SEC / 2)
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
    """The learner's forward of `model` over the probe's `inputs` -> (distribution parameters, values): a
    recurrent core unrolled over [minibatch / 16, 16] steps and sequences, as the learner runs it."""
    import torch

    if not model.recurrent:
        return lambda: model(inputs)
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
    env_wall, env_cpu, obs, env_bytes = measure_env(cfg, spec, probe_envs)
    inference, learn = measure_model(cfg, spec, obs, batch=max(probe_envs, 64))
    return Costs(env_wall, env_cpu, inference, 0.0 if cfg.run.sampling_only else learn, env_bytes)


def _divisors(n: int, multiple: int = 1) -> list:
    """Divisors of n that are multiples of `multiple` (a multi-agent env's rows per game)."""
    return [d for d in range(multiple, n + 1, multiple) if n % d == 0]


def choose_rollout(costs: Costs, train_batch: int) -> int:
    """--rollout auto: ROLLOUT_SHORT when even the widest split that whole slots of ROLLOUT_DEFAULT steps
    allow (train_batch / ROLLOUT_DEFAULT envs, under MAX_ENVS_PER_SPLIT) steps in under a quarter of
    TARGET_SPLIT_SEC: a cheap env (CartPole: 128 envs in 0.07 ms) whose splits are then twice as wide,
    so the policy worker's fixed costs per request (the round trip, the forward's overheads) weigh half
    as much per sample; else ROLLOUT_DEFAULT."""
    widest = train_batch // ROLLOUT_DEFAULT
    if widest < MAX_ENVS_PER_SPLIT and widest * costs.env_wall < TARGET_SPLIT_SEC / 4:
        return ROLLOUT_SHORT
    return ROLLOUT_DEFAULT


def choose_envs_per_split(costs: Costs, slot_divisor: int, hint: int, multiple: int = 1) -> int:
    """Fewest envs per split (a divisor of slot_divisor and a multiple of `multiple`, at least `hint`)
    whose step takes TARGET_SPLIT_SEC; the largest allowed when none does."""
    allowed = [d for d in _divisors(slot_divisor, multiple) if d <= MAX_ENVS_PER_SPLIT] or [multiple]
    for d in allowed:
        if d >= min(hint, allowed[-1]) and d * costs.env_wall >= TARGET_SPLIT_SEC:
            return d
    return allowed[-1]


def choose_num_workers(costs: Costs, cores: int, learner_threads: int = 1) -> tuple[int, float]:
    """Workers whose env steps keep up with what learning and inference can consume on `cores`;
    returns (workers, the demand in env steps/s that sized them)."""
    per_step_cpu = costs.env_cpu + costs.inference + costs.learn
    demand = cores / per_step_cpu  # every core busy with the three
    if costs.learn > 0:
        demand = min(demand, min(learner_threads, cores) / costs.learn)  # the learner: one process
    demand = min(demand, 1.0 / costs.inference)  # the policy worker: one process
    env_cores = HEADROOM * demand * costs.env_cpu  # cores busy stepping envs at that rate
    workers = math.ceil(HEADROOM * demand * costs.env_wall)
    if costs.env_cpu >= 0.5 * costs.env_wall:  # CPU-bound: more workers than cores only contend
        workers = min(workers, max(1, math.ceil(env_cores)), cores)
    return max(1, min(workers, MAX_WORKERS_PER_CORE * cores)), demand


def fit_memory(
    workers: int,
    per_split: int,
    splits: int,
    costs: Costs,
    available_bytes: float,
    allowed_per_split: list,
    fixed_workers: bool = False,
    fixed_envs: bool = False,
) -> tuple[int, int]:
    """(workers, envs per split) lowered until the envs and the processes fit in ENV_MEMORY_SHARE of
    `available_bytes`: fewer workers while the processes alone do not fit, then fewer envs per split
    (down the `allowed_per_split` sizes), then fewer workers; a size the user gave (`fixed_*`) stays."""
    budget = ENV_MEMORY_SHARE * available_bytes

    def fits(w: int, e: int) -> bool:
        return w * splits * e * costs.env_bytes + (w + 3) * PROCESS_MEMORY_BYTES <= budget

    while not fixed_workers and workers > 1 and (workers + 3) * PROCESS_MEMORY_BYTES > budget:
        workers -= 1
    smaller = sorted(d for d in allowed_per_split if d < per_split)
    while not fits(workers, per_split):
        if not fixed_envs and smaller:
            per_split = smaller.pop()
        elif not fixed_workers and workers > 1:
            workers -= 1
        else:
            break  # the plan's memory check speaks if even this does not fit
    return workers, per_split


def resolve_sampler(cfg, spec, envs_per_worker_hint: int):
    """--num_workers auto and --num_envs_per_worker auto chosen (by measurement unless in serial mode):
    returns (a SamplerConfig without 'auto', the lines that explain the choice; none when nothing
    was auto). `cfg` is otherwise resolved (the model is measured as it will run)."""
    s = cfg.sampler
    auto_workers, auto_envs = s.num_workers == "auto", s.num_envs_per_worker == "auto"
    whole_games = spec.num_agents * s.worker_num_splits  # a multi-agent env's games are never split
    envs_per_worker_hint = -(-envs_per_worker_hint // whole_games) * whole_games
    # --rollout auto is shortened only where the envs per split are chosen here, for a feed-forward policy
    shorten = s.rollout == "auto" and auto_envs and cfg.run.mode != "serial" and cfg.model.rnn == "none"
    if s.rollout == "auto":
        s = dataclasses.replace(s, rollout=ROLLOUT_DEFAULT)
    if not (auto_workers or auto_envs):
        return s, []
    if cfg.run.mode == "serial":  # every role shares this one process: nothing to balance
        return _serial_sizes(s, envs_per_worker_hint)
    return _measured_sizes(cfg, spec, s, envs_per_worker_hint, shorten)


def _serial_sizes(s, envs_per_worker_hint: int) -> tuple:
    """Serial mode: one worker and the family's envs per worker, where they are auto."""
    chosen = dataclasses.replace(
        s,
        num_workers=1 if s.num_workers == "auto" else s.num_workers,
        num_envs_per_worker=envs_per_worker_hint if s.num_envs_per_worker == "auto" else s.num_envs_per_worker,
    )
    return chosen, [
        f"serial mode, nothing to balance: {chosen.num_workers} workers x {chosen.num_envs_per_worker} envs"
    ]


def _measured_sizes(cfg, spec, s, envs_per_worker_hint: int, shorten: bool) -> tuple:
    """The sizes that are auto (and the rollout, where `shorten`) chosen from what one env step, one
    inference and one training sample cost here, then fitted in memory; (SamplerConfig, lines)."""
    cores = usable_cores()
    auto_workers, auto_envs = s.num_workers == "auto", s.num_envs_per_worker == "auto"
    probe = (envs_per_worker_hint if auto_envs else int(s.num_envs_per_worker)) // s.worker_num_splits
    probe = -(-max(1, probe) // spec.num_agents) * spec.num_agents  # whole games of a multi-agent env
    costs = measure(cfg, spec, probe)
    lines = [
        f"measured on {cores} cores: env step {costs.env_wall * 1e6:,.1f} us wall "
        f"({costs.env_cpu * 1e6:,.1f} us CPU), inference {costs.inference * 1e6:,.1f} us/sample, "
        f"training {costs.learn * 1e6:,.1f} us/sample "
        + (
            f"at {cfg.replay.replay_ratio:g} trained per env step"
            if cfg.uses_replay
            else f"over {cfg.learner.num_epochs} epochs"
        )
    ]
    num_workers, num_envs = s.num_workers, s.num_envs_per_worker
    train_batch = cfg.learner.batch_size * cfg.learner.num_batches_per_epoch
    if shorten and choose_rollout(costs, train_batch) != s.rollout:
        s = dataclasses.replace(s, rollout=choose_rollout(costs, train_batch))
        lines.append(_rollout_line(s.rollout, costs, train_batch))
    if auto_envs:
        hint_per_split = max(1, envs_per_worker_hint // s.worker_num_splits)
        per_split = choose_envs_per_split(costs, train_batch // s.rollout, hint_per_split, spec.num_agents)
        num_envs = per_split * s.worker_num_splits
        lines.append(
            f"--num_envs_per_worker auto = {num_envs}: {per_split} envs per split step in "
            f"{per_split * costs.env_wall * 1e3:.2f} ms (target >= {TARGET_SPLIT_SEC * 1e3:g} ms, so a "
            f"round trip to the policy worker is a small part of it; whole slots per training batch)"
        )
    if auto_workers:
        num_workers, demand = choose_num_workers(costs, cores, cfg.learner.learner_threads)
        lines.append(
            f"--num_workers auto = {num_workers}: learning and inference can take about "
            f"{demand:,.0f} env steps/s on {cores} cores, one worker supplies {1 / costs.env_wall:,.0f}"
        )
    num_workers, num_envs = _within_memory(
        s, costs, num_workers, num_envs, train_batch // s.rollout, lines, spec.num_agents
    )
    return dataclasses.replace(s, num_workers=num_workers, num_envs_per_worker=num_envs), lines


def _rollout_line(rollout: int, costs: Costs, train_batch: int) -> str:
    """Why --rollout auto was shortened to `rollout`."""
    widest = train_batch // ROLLOUT_DEFAULT
    return (
        f"--rollout auto = {rollout}: {widest} envs step in {widest * costs.env_wall * 1e3:.2f} ms, so slots of "
        f"{rollout} steps let splits be twice as wide"
    )


def _within_memory(
    s, costs: Costs, num_workers: int, num_envs: int, slot_divisor: int, lines: list, multiple: int = 1
) -> tuple:
    """The chosen sizes, lowered where the envs would not fit in memory (see fit_memory); says so in
    `lines`."""
    import psutil

    splits, available = s.worker_num_splits, psutil.virtual_memory().available
    allowed = [d for d in _divisors(slot_divisor, multiple) if d <= MAX_ENVS_PER_SPLIT]
    fixed_envs = s.num_envs_per_worker != "auto"
    workers, per_split = fit_memory(
        num_workers,
        num_envs // splits,
        splits,
        costs,
        available,
        allowed,
        fixed_workers=s.num_workers != "auto",
        fixed_envs=fixed_envs,
    )
    envs = num_envs if fixed_envs else per_split * splits  # a size the user gave is kept as given
    if (workers, envs) != (num_workers, num_envs):
        lines.append(
            f"lowered to {workers} workers x {envs} envs so that the envs "
            f"({costs.env_bytes / 2**20:,.1f} MiB each) and the processes fit in "
            f"{ENV_MEMORY_SHARE:.0%} of the {available / 2**30:,.1f} GiB available"
        )
    return workers, envs
