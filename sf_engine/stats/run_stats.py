"""Run statistics: the one reader that aggregates the roles' typed messages (sf_engine.stats.messages) into
the figures of a run. Runs in the main process; writing them out (TensorBoard, terminal, summary.json)
is sf_engine.stats.report's job.

Throughput figures: env steps/s counts agent steps; frames/s = env steps/s x frameskip.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque

from sf_engine.stats import messages as msg
from sf_engine.stats.books import Books, PolicyBooks, ReplayReports
from sf_engine.stats.bottleneck import diagnose, subtract
from sf_engine.stats.episode_order import EpisodeOrder
from sf_engine.stats.rates import RateWindow
from sf_engine.stats.ratings_figures import ratings_summary
from sf_engine.stats.replay_figures import ReplayFigures
from sf_engine.stats.stages import LiveStage

WARMUP_SEC = 2.0  # throughput "after warm-up" starts this long after the first env step
WINDOW_SEC = 2.0  # throughput windows after warm-up (benchmarks report their median)
BOTTLENECK_EVERY_SEC = 30.0


class Throughput:
    """Env steps and learner samples over time: rates over the last seconds, 2-s windows after warm-up,
    and the rate from the end of warm-up to the stop."""

    def __init__(self, env_steps_base: int):
        self.base = env_steps_base
        self.counts = RateWindow(60.0)  # (env steps, learner samples) over the last 60 s
        self.first_step_time = None
        self.warmup = self.window_start = self.stopped_at = None  # (time, env steps)
        self.window_rates: deque = deque(maxlen=1000)

    def sample(self, now: float, env_steps: int, learner_samples: int) -> None:
        self.counts.add(now, (env_steps, learner_samples))
        if self.first_step_time is None and env_steps > self.base:
            self.first_step_time = now
        elif self.warmup is None and self.first_step_time and now - self.first_step_time >= WARMUP_SEC:
            self.warmup = self.window_start = (now, env_steps)
        elif self.window_start and now - self.window_start[0] >= WINDOW_SEC and self.stopped_at is None:
            self.window_rates.append((env_steps - self.window_start[1]) / (now - self.window_start[0]))
            self.window_start = (now, env_steps)

    def latest(self) -> tuple:
        """(time, env steps) of the newest sample."""
        now, (env_steps, _) = self.counts.samples[-1]
        return now, env_steps

    def env_steps_rate(self, window_sec: float) -> float:
        """Env steps per second over the last `window_sec`."""
        return self.counts.rate(window_sec, 0)

    def samples_rate(self, window_sec: float) -> float:
        """Learner samples per second over the last `window_sec`."""
        return self.counts.rate(window_sec, 1)

    def env_steps_per_sec(self) -> float:
        """From the end of warm-up to the stop (from the first env step when the run was too short)."""
        end_time, end_steps = self.stopped_at or self.latest()
        start = self.warmup if self.warmup and end_time - self.warmup[0] >= WINDOW_SEC else None
        if start is None and self.first_step_time is not None:
            first = next(counts[0] for at, counts in self.counts.samples if at >= self.first_step_time)
            start = (self.first_step_time, first)
        if start is None or end_time <= start[0]:
            return 0.0
        return (end_steps - start[1]) / (end_time - start[0])


HANDLERS = {  # each message type and the RunStats method that takes it in
    msg.Episodes: "_episodes",
    msg.Training: "_training",
    msg.Inference: "_inference",
    msg.Evaluation: "_evaluation",
    msg.CheckpointWritten: "_checkpoint",
    msg.CheckpointFailed: "_checkpoint_failed",
    msg.Recycled: "_recycled",
    msg.Recovered: "_recovered",
    msg.Fault: "_fault",
    msg.PbtRound: "_pbt",
    msg.Ratings: "_ratings",
    msg.RemoteNodes: "_remote",
    msg.ReplayStatus: "_replay_status",
}


class RunStats:
    """Aggregates the messages of every role. `env_step_counters`: the shared per-worker env-step counts."""

    def __init__(
        self,
        env_steps_base: int,
        env_step_counters,
        on_gpu: bool = False,
        ordered_workers: int = 0,
        learner_live: LiveStage | None = None,
    ):
        """`ordered_workers`: --deterministic, the rollout workers whose episodes are taken in the order they ended
        (EpisodeOrder), every one of them, even after the stop (the run's processes stop at the same step).
        `learner_live`: the learner's stage now, counted in its stage seconds before its report books it."""
        self.env_steps_base, self.counters = env_steps_base, env_step_counters
        self.learner_live = learner_live
        self.order = EpisodeOrder(ordered_workers) if ordered_workers else None
        self.start_time = time.monotonic()
        self.throughput = Throughput(env_steps_base)
        self.returns, self.lengths = deque(maxlen=100), deque(maxlen=100)
        self.extra: dict = {}  # name -> the last 100 values of an env's own episode stat
        self.episodes = 0
        self.training: msg.Training | None = None  # the latest batch
        self.lag_sum, self.lag_count, self.lag_max = 0.0, 0, 0.0
        self.stages: dict = {}  # role -> its latest Stages
        self.inference_forwards, self.inference_samples = 0, 0
        self.policy_returns: dict = {}  # --num_policies > 1: policy -> its last 100 episode returns
        self.seat_returns: dict = {}  # multi-agent envs: seat -> its last 100 episode returns
        self.policy_training: dict = {}  # policy -> its latest Training
        self.policy_books: dict = {}  # policy -> its PolicyBooks
        self.pbt: msg.PbtRound | None = None  # --pbt: the latest round
        self.ratings: msg.Ratings | None = None  # two-player games of several acting policies: the latest ratings
        self.pbt_exploits: list = []  # every exploit of the run: (round, replaced, copied, objectives)
        self.evaluation: msg.Evaluation | None = None
        self.remote: msg.RemoteNodes | None = None  # --num_remote_samplers: the receiver's latest report
        self.remote_steps = RateWindow(60.0)  # env steps each sampler actor stepped, last 60 s
        self.checkpoint_path = None
        self.arrivals: list = []  # (observer method, value): checkpoints and evaluations not yet handed on
        self.checkpoint_failures, self.worker_restarts, self.policy_worker_restarts = 0, 0, 0
        self.learner_restarts, self.evaluator_restarts = 0, 0
        self.recoveries: list = []  # each restarted learner's line: where its weights and optimizer state came from
        self.faults: dict = {}  # (role, index) -> traceback of its latest failure, until the supervisor takes it
        self.books = Books()
        self.replay = ReplayFigures()  # --algo dqn: the replay buffer's figures
        self.replay_samples, self.replay_reports = 0, ReplayReports()  # with a replay buffer: transitions trained
        self.skipped_updates = 0  # the learner's optimizer steps skipped for a non-finite loss or gradient
        self.diagnosis = None
        self.on_gpu = on_gpu  # the learner and policy worker on CUDA: the bottleneck report's advice differs
        self.bottleneck_snapshot = None  # (time, stage seconds) where the current window starts
        self.stopped = False
        self.episodes_final = False  # the stop was decided on the episodes' figures: later ones do not count

    @property
    def env_steps(self) -> int:
        return self.env_steps_base + int(self.counters.sum())

    @property
    def return_mean(self):
        return sum(self.returns) / len(self.returns) if self.returns else None

    @property
    def seat_return_means(self) -> list | None:
        """Multi-agent envs: each seat's mean return over its last 100 episodes (None for a seat without
        one), in seat order; None before any episode or with one agent."""
        if not self.seat_returns:
            return None
        seats = range(max(self.seat_returns) + 1)
        return [sum(r) / len(r) if (r := self.seat_returns.get(seat)) else None for seat in seats]

    @property
    def extra_means(self) -> dict:
        """name -> mean of the last 100 values of each of the envs' own episode stats."""
        return {name: sum(values) / len(values) for name, values in self.extra.items() if values}

    def policy_figures(self) -> list:
        """--num_policies > 1: per policy, its mean return (last 100 episodes), version, lag and rate."""
        figures = []
        for policy in sorted(set(self.policy_returns) | set(self.policy_training)):
            returns, train = self.policy_returns.get(policy, ()), self.policy_training.get(policy)
            books = self.policy_books.get(policy, PolicyBooks())
            figures.append(
                {
                    "policy": policy,
                    "episode_return_mean": sum(returns) / len(returns) if returns else None,
                    "episodes": len(returns),
                    "version": train.version if train else 0,
                    "policy_lag_mean": books.lag_sum / books.lag_count if books.lag_count else None,
                    "policy_lag_max": books.lag_max,
                    "learning_rate": train.learning_rate if train else None,
                    "trained_samples": books.trained,
                    "trained_samples_per_sec": books.trained / max(time.monotonic() - self.start_time, 1e-9),
                    "learner_train_sec": books.train_sec,
                    "inference_sec": books.forward_sec,
                }
            )
        return figures

    @property
    def stage_sec(self) -> dict:
        """role -> stage -> seconds, the learner's stage in progress included (a long first round is busy)."""
        out = {role: dict(stages.stage_sec) for role, stages in self.stages.items()}
        now = self.learner_now(since_report=True)
        if now is not None:
            learner = out.setdefault(self.learner_live.role, {})
            learner[now[0]] = learner.get(now[0], 0.0) + now[1]
        return out

    def learner_now(self, since_report: bool = False) -> tuple[str, float] | None:
        """(the learner's stage now, its seconds in it), or None (no stage entered); `since_report`: only the seconds
        its latest report does not hold."""
        if self.learner_live is None:
            return None
        reported = self.stages.get(self.learner_live.role)
        return self.learner_live.in_progress(reported.at if reported is not None and since_report else 0.0)

    def consume(self, messages: list) -> None:
        for message in messages:
            getattr(self, HANDLERS[type(message)])(message)

    def _replay_status(self, m: msg.ReplayStatus) -> None:
        self.replay.consume(m)

    def _episodes(self, m: msg.Episodes) -> None:
        if self.episodes_final and self.order is None:
            return
        self.episodes += m.count
        for name, values in m.extra.items():
            self.extra.setdefault(name, deque(maxlen=100)).extend(values)
        self.stages[m.stages.role] = m.stages
        if self.order is not None and m.worker >= 0:
            for episode in self.order.add(m):
                self._episode(*episode)
            return
        self.returns.extend(m.returns)
        self.lengths.extend(m.lengths)
        for policy, value in zip(m.policies, m.returns[-len(m.policies) :] if m.policies else []):
            self.policy_returns.setdefault(policy, deque(maxlen=100)).append(value)
        for seat, value in zip(m.seats, m.returns[-len(m.seats) :] if m.seats else []):
            self.seat_returns.setdefault(seat, deque(maxlen=100)).append(value)

    def _episode(self, value: float, length: int, policy=None, seat=None) -> None:
        """One episode's return and length (--deterministic: in the order of EpisodeOrder)."""
        self.returns.append(value)
        self.lengths.append(length)
        if policy is not None:
            self.policy_returns.setdefault(policy, deque(maxlen=100)).append(value)
        if seat is not None:
            self.seat_returns.setdefault(seat, deque(maxlen=100)).append(value)

    def _training(self, m: msg.Training) -> None:
        self.training = m
        self.policy_training[m.policy] = m
        books = self.policy_books.setdefault(m.policy, PolicyBooks())
        books.lag_sum += m.lag_mean * m.lag_count
        books.lag_count += m.lag_count
        books.lag_max = max(books.lag_max, m.lag_max)
        books.trained += m.samples
        books.train_sec += m.train_sec
        not_trainable, skipped = m.not_trainable, m.skipped_non_finite
        if m.inserted is None:
            self.books.trained += m.samples
        else:  # the env steps went into the replay buffer; m.samples were sampled from it
            inserted, not_trainable, skipped = self.replay_reports.not_counted(m)
            self.books.inserted_replay += inserted
            self.replay_samples += m.samples
        self.books.dropped_lag += m.dropped_lag
        self.books.not_trainable += not_trainable
        self.books.skipped_non_finite += skipped
        self.skipped_updates += m.skipped_updates
        self.lag_sum += m.lag_mean * m.lag_count
        self.lag_count += m.lag_count
        self.lag_max = max(self.lag_max, m.lag_max)
        self.stages[m.stages.role] = m.stages

    def _inference(self, m: msg.Inference) -> None:
        self.stages[m.stages.role] = m.stages
        self.inference_forwards += m.forwards
        self.inference_samples += m.samples
        for policy, seconds in m.policy_sec.items():
            self.policy_books.setdefault(policy, PolicyBooks()).forward_sec += seconds

    def _evaluation(self, m: msg.Evaluation) -> None:
        self.evaluation = m
        self.arrivals.append(("on_evaluation", dataclasses.asdict(m) | {"ratings": ratings_summary(self.ratings)}))

    def _ratings(self, m: msg.Ratings) -> None:
        self.ratings = m

    def _pbt(self, m: msg.PbtRound) -> None:
        self.pbt = m
        self.pbt_exploits += [(m.round, *exploit) for exploit in m.exploits]
        for target, source, worse, better in m.exploits:
            logging.info(
                "PBT round %d: policy %d (objective %.2f) takes policy %d's weights (%.2f); its hyperparameters now %s",
                m.round,
                target,
                worse,
                source,
                better,
                ", ".join(f"{k} {v:.3g}" for k, v in m.hyperparameters[target].items()),
            )
        if m.round == 0:
            for member, hyper in enumerate(m.hyperparameters):
                logging.info(
                    "PBT: policy %d starts with %s", member, ", ".join(f"{k} {v:.3g}" for k, v in hyper.items())
                )

    def _remote(self, m: msg.RemoteNodes) -> None:
        self.remote = m
        self.stages[m.stages.role] = m.stages
        self.remote_steps.add(time.monotonic(), tuple(node.stepped for node in m.nodes))

    def remote_figures(self) -> list:
        """--num_remote_samplers: each sampler actor's figures (RemoteFigures as a dict), with its env
        steps/s over the last 10 s and its mean lag at arrival."""
        if self.remote is None:
            return []
        rates = self.remote_steps.rates(10.0)
        return [
            {
                **{k: v for k, v in vars(node).items() if k != "lag_sum"},
                "env_steps_per_sec_10s": round(rate, 1),
                "lag_mean": node.lag_sum / node.lag_count if node.lag_count else None,
            }
            for node, rate in zip(self.remote.nodes, rates)
        ]

    def _checkpoint(self, m: msg.CheckpointWritten) -> None:
        self.checkpoint_path = m.path
        self.arrivals.append(("on_checkpoint", m.path))

    def take_arrivals(self) -> list:
        """The (observer method, value) of each checkpoint written and evaluation ended since the last call."""
        arrivals, self.arrivals = self.arrivals, []
        return arrivals

    def _checkpoint_failed(self, m: msg.CheckpointFailed) -> None:
        self.checkpoint_failures += 1
        logging.warning("checkpoint not written (%s): the previous one is kept, training goes on", m.reason)

    def _recycled(self, m: msg.Recycled) -> None:
        self.books.recycled_untrained += m.steps

    def _recovered(self, m: msg.Recovered) -> None:
        self.recoveries.append(m.note)
        logging.warning("%s", m.note)

    def _fault(self, m: msg.Fault) -> None:
        self.faults[(m.role, m.index)] = m.traceback

    def sample(self) -> None:
        """Sample the counters (report.Reporter.tick, a few times a second)."""
        now = time.monotonic()
        self.throughput.sample(now, self.env_steps, self.books.trained + self.replay_samples)
        if self.bottleneck_snapshot is None and self.throughput.warmup is not None:
            self.bottleneck_snapshot = (now, self.stage_sec)

    def bottleneck_due(self) -> bool:
        snapshot = self.bottleneck_snapshot
        return snapshot is not None and not self.stopped and time.monotonic() - snapshot[0] >= BOTTLENECK_EVERY_SEC

    def diagnose_window(self) -> float:
        """Name the binding stage over the window since the last diagnosis; returns the window's seconds."""
        now = time.monotonic()
        then, old = self.bottleneck_snapshot
        self.diagnosis = diagnose(subtract(self.stage_sec, old), now - then, self.replay.ratio_target, self.on_gpu)
        self.bottleneck_snapshot = (now, self.stage_sec)
        return now - then

    def stop(self, episodes_final: bool) -> None:
        """The run decided to stop: throughput figures are final as of now (steps taken while the processes wind
        down still count in env_steps). `episodes_final`: the stop was decided on the episodes' figures (a return
        target, an observer), which stay as they were then; otherwise the episodes the workers report as they stop
        count too, as their steps do (a run shorter than a worker's report interval has its episodes only there)."""
        self.sample()
        self.stopped, self.episodes_final = True, episodes_final
        self.throughput.stopped_at = self.throughput.latest()

    def finish(self) -> None:
        """After the stop: a run shorter than one bottleneck window is judged whole; --deterministic: the episodes
        still held for their order are counted."""
        self.sample()
        for episode in self.order.flush() if self.order is not None else ():
            self._episode(*episode)
        if self.diagnosis is None and self.stages:
            self.diagnosis = diagnose(
                self.stage_sec, time.monotonic() - self.start_time, self.replay.ratio_target, self.on_gpu
            )
