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
import math

from sf_engine.config.groups import ROLLOUT_DEFAULT, ROLLOUT_SHORT
from sf_engine.run.costs import Costs, measure, usable_cores

TARGET_SPLIT_SEC = 2e-3
MAX_ENVS_PER_SPLIT = 256
MAX_WORKERS_PER_CORE = 4
HEADROOM = 1.5  # a worker's cycle also holds writing the slot and the round trip to the policy worker
PROCESS_MEMORY_BYTES = 400 * 2**20  # resident memory of one process (torch, libraries) besides buffers and envs
ENV_MEMORY_SHARE = 0.5  # the envs auto sizing builds take at most this share of the memory available


def count(n: int, noun: str) -> str:
    """'1 worker', '2 workers'."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


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
        return _fixed_sizes(s, envs_per_worker_hint, "serial mode, nothing to balance")
    if cfg.env.env_backend == "device":  # a sampler process per env batch, which lives on the device
        return _device_sizes(cfg, s, envs_per_worker_hint, shorten)
    return _measured_sizes(cfg, spec, s, envs_per_worker_hint, shorten)


def _device_sizes(cfg, s, envs_per_worker_hint: int, shorten: bool) -> tuple:
    """Device mode: one sampler where --num_workers is auto. On-policy, --rollout auto = ROLLOUT_SHORT and
    --num_envs_per_worker auto = the envs whose slots of --rollout steps each hold one training batch (in sync mode,
    whose rollouts of every sampler together hold one): a device env steps its whole batch as one tensor program, at
    about the same cost for 256 envs as for 128, so the widest slots cost least per env step
    (docs/performance.md#device-envs). With a replay buffer, or envs given, the family's envs per worker."""
    why = f"device mode, one sampler per env batch on {cfg.run.device}"
    if cfg.uses_replay or s.num_envs_per_worker != "auto":
        return _fixed_sizes(s, envs_per_worker_hint, why)
    s = dataclasses.replace(s, rollout=ROLLOUT_SHORT) if shorten else s
    workers = 1 if s.num_workers == "auto" else s.num_workers
    train_batch = cfg.train_batch
    slots = workers * s.worker_num_splits if cfg.run.mode == "sync" else 1
    envs = max(1, train_batch // (s.rollout * slots)) * s.worker_num_splits
    chosen = dataclasses.replace(s, num_workers=workers, num_envs_per_worker=envs)
    return chosen, [f"{why}: {count(workers, 'sampler')} x {count(envs, 'env')}, rollouts of {chosen.rollout} steps"]


def _fixed_sizes(s, envs_per_worker_hint: int, why: str) -> tuple:
    """Serial mode (and device mode but for an on-policy env batch): one worker and the family's envs per worker,
    where they are auto."""
    chosen = dataclasses.replace(
        s,
        num_workers=1 if s.num_workers == "auto" else s.num_workers,
        num_envs_per_worker=envs_per_worker_hint if s.num_envs_per_worker == "auto" else s.num_envs_per_worker,
    )
    return chosen, [f"{why}: {count(chosen.num_workers, 'worker')} x {count(chosen.num_envs_per_worker, 'env')}"]


def _measured_sizes(cfg, spec, s, envs_per_worker_hint: int, shorten: bool) -> tuple:
    """The sizes that are auto (and the rollout, where `shorten`) chosen from what one env step, one
    inference and one training sample cost here, then fitted in memory; (SamplerConfig, lines)."""
    cores = usable_cores()
    auto_workers, auto_envs = s.num_workers == "auto", s.num_envs_per_worker == "auto"
    probe = (envs_per_worker_hint if auto_envs else int(s.num_envs_per_worker)) // s.worker_num_splits
    probe = -(-max(1, probe) // spec.num_agents) * spec.num_agents  # whole games of a multi-agent env
    costs = measure(cfg, spec, probe)
    busy = f", {costs.others_busy:.1f} of them busy with other processes" if costs.others_busy >= 0.25 else ""
    queued = f", {costs.queued * 1e6:,.1f} us more waiting for a core" if costs.queued >= 0.1 * costs.env_wall else ""
    lines = [
        f"measured on {cores} cores{busy}: env step {costs.env_wall * 1e6:,.1f} us wall "
        f"({costs.env_cpu * 1e6:,.1f} us CPU{queued}), inference {costs.inference * 1e6:,.1f} us/sample, "
        f"training {costs.learn * 1e6:,.1f} us/sample "
        + (
            f"at {cfg.replay.replay_ratio:g} trained per env step"
            if cfg.uses_replay
            else f"over {cfg.learner.num_epochs} epochs"
        )
    ]
    num_workers, num_envs = s.num_workers, s.num_envs_per_worker
    train_batch = cfg.train_batch
    if shorten and choose_rollout(costs, train_batch) != s.rollout:
        s = dataclasses.replace(s, rollout=choose_rollout(costs, train_batch))
        lines.append(_rollout_line(s.rollout, costs, train_batch))
    if auto_envs:
        hint_per_split = max(1, envs_per_worker_hint // s.worker_num_splits)
        # whole slots per learner rank's share of the batch (--num_learners: each rank takes its own slots)
        rank_rows = train_batch // s.rollout // cfg.parallel.num_learners
        per_split = choose_envs_per_split(costs, rank_rows, hint_per_split, spec.num_agents)
        num_envs = per_split * s.worker_num_splits
        lines.append(
            f"--num_envs_per_worker auto = {num_envs}: {count(per_split, 'env')} per split step in "
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
            f"lowered to {count(workers, 'worker')} x {count(envs, 'env')} so that the envs "
            f"({costs.env_bytes / 2**20:,.1f} MiB each) and the processes fit in "
            f"{ENV_MEMORY_SHARE:.0%} of the {available / 2**30:,.1f} GiB available"
        )
    return workers, envs
