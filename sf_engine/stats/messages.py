"""Typed stats messages: what each role reports to the main process through the stats queue.

Small dataclasses (pickled by faster-fifo); sf_engine.stats.run_stats.RunStats aggregates them. Stage seconds
are cumulative per process: `stage_sec` {stage: seconds} covers `wall_sec` of that process's loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stages:
    """Where one process's time went: `role` names it ('learner', 'policy_worker', 'rollout_worker_3')."""

    role: str
    stage_sec: dict
    wall_sec: float
    at: float = 0.0  # time.monotonic() up to which stage_sec books the process's time


@dataclass
class Episodes:
    """Rollout worker: episodes finished since its last report (the last 100 of them in full); `extra`:
    the envs' own episode stats, name -> the last 100 values."""

    stages: Stages
    count: int
    returns: list
    lengths: list
    extra: dict = field(default_factory=dict)
    policies: list = field(default_factory=list)  # --num_policies > 1: the policy of each of `returns`
    seats: list = field(default_factory=list)  # multi-agent envs: the seat (agent index) of each of `returns`
    # --deterministic: each of `returns`' (step of its split, worker, env) and the worker's index; every episode of
    # it that ended before its step `through` is reported (RunStats takes them in that order, not as they arrive)
    order: list = field(default_factory=list)
    worker: int = -1
    through: int = 0


@dataclass
class Training:
    """Learner: one training batch of one policy. Lag = learner version - the version that acted, over
    valid samples."""

    stages: Stages
    version: int
    samples: int
    dropped_lag: int
    not_trainable: int
    lag_count: int
    lag_min: float
    lag_mean: float
    lag_max: float
    learning_rate: float
    losses: dict = field(default_factory=dict)  # policy_loss, value_loss, entropy, approx_kl, ...
    policy: int = 0
    train_sec: float = 0.0  # the learner's seconds on this policy's part of the batch
    skipped_non_finite: int = 0  # steps a rollout worker skipped for a non-finite value (not in not_trainable)
    skipped_updates: int = 0  # optimizer steps skipped for a non-finite loss or gradient
    inserted: int | None = None  # with a replay buffer: trainable env steps put into it (`samples`: trained)
    report_number: int = 0  # with a replay buffer: the learner's reports of its inserts, counted across its deaths


@dataclass
class ReplayStatus:
    """Learner with a replay buffer (--algo dqn): its books since it started (cumulative, as kept in shared
    memory): env steps `inserted` and transitions `sampled` for training, transitions `stored` of `capacity`,
    the replay ratio reached since learning started (None before) and the target, the age of the latest
    minibatch (versions: learner version - the version that acted; mean and max), and the seconds the learner
    waited for data while the ratio allowed no training (learning was the faster side; the rollout workers'
    wait for free slots says how long sampling waited for learning)."""

    inserted: int
    sampled: int
    stored: int
    capacity: int
    replay_ratio: float | None
    replay_ratio_target: float
    learning_starts: int
    age_mean: float
    age_max: float
    learner_waited_sec: float


@dataclass
class Inference:
    """Policy worker: forward passes and samples since its last report."""

    stages: Stages
    forwards: int
    samples: int
    policy_sec: dict = field(default_factory=dict)  # --num_policies > 1: policy -> its forwards' seconds


@dataclass
class Evaluation:
    """Evaluator: one greedy evaluation of `version`."""

    version: int
    return_mean: float
    return_std: float
    length_mean: float
    episodes: int
    unfinished: int
    best: float
    seconds: float
    win_rate: float | None = None  # two-player games: against a random player, from both seats
    draw_rate: float | None = None
    loss_rate: float | None = None


@dataclass
class PbtRound:
    """Learner with --pbt: a round (0: the population's start). `exploits` [(replaced member, member it
    copied, its objective, the copied one's)]; `hyperparameters`: each member's after the round."""

    round: int
    exploits: list
    hyperparameters: list
    objectives: list


@dataclass
class PlayerRating:
    """One acting policy of a two-player run: a trained policy ('policy_0', or its --league role) or a pool snapshot
    ('pool_3', `frozen`: its weights are the `version` of the trained policy `source` names, 'main_agent@v120');
    its rating (sf_engine.selfplay.ratings); with a plain pool, for a snapshot, the learning policies' win rate
    against it (last 200 games) and its chance to be drawn as an opponent (--opponent_sampling)."""

    name: str
    policy: int
    version: int
    frozen: bool
    mu: float | None
    sigma: float | None
    ordinal: float | None
    games: int
    win_rate: float | None = None
    chance: float | None = None
    source: str | None = None


@dataclass
class Ratings:
    """Learner, two-player games of several acting policies: every player's rating, and the games rated so far."""

    players: list  # [PlayerRating]
    games: int


@dataclass
class CheckpointWritten:
    path: str


@dataclass
class CheckpointFailed:
    reason: str


@dataclass
class Recycled:
    """Learner with --sampling_only: env steps handed back untrained."""

    steps: int


@dataclass
class Recovered:
    """A restarted learner: where each policy's weights and optimizer state came from (one line)."""

    note: str


@dataclass
class Fault:
    """A role's process failed: its traceback, logged once by the supervisor."""

    role: str
    index: int
    traceback: str


@dataclass
class RemoteFigures:
    """One sampler actor's figures since the run started (cumulative), as the receiver keeps them: its
    `host`, Ray `node` and `pid` (the latest incarnation's), `slots` placed here, `restarts`, `recovery_sec`
    (from a loss to its successor's first reply, the latest), the lag of its slots at arrival (`lag_sum`,
    `lag_count`, `lag_max`), seconds spent `sample_sec` (the actor collecting), `fetch_sec` (moving its slots
    out of the object store) and `write_sec` (into local slots), its policy worker's `forwards` and
    `forward_samples`, and env steps `stepped` (as it reported them), `placed` in local slots and `dropped`
    with a lost actor."""

    sampler: int
    host: str | None = None
    node: str | None = None
    pid: int | None = None
    slots: int = 0
    restarts: int = 0
    recovery_sec: float | None = None
    lag_sum: float = 0.0
    lag_count: int = 0
    lag_max: int = 0
    sample_sec: float = 0.0
    fetch_sec: float = 0.0
    write_sec: float = 0.0
    forwards: int = 0
    forward_samples: int = 0
    stepped: int = 0
    placed: int = 0
    dropped: int = 0


@dataclass
class RemoteNodes:
    """Receiver: every sampler actor's RemoteFigures, and the weights it sent them (versions, bytes)."""

    stages: Stages
    nodes: list
    weights_versions_sent: int = 0
    weights_bytes_sent: int = 0
