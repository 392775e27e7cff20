"""Run statistics: aggregates the roles' messages, writes TensorBoard scalars, the terminal status line
and summary.json. Runs in the runner (no torch: events are written with TensorBoard's own writer).

Throughput figures: env steps/s counts agent steps; frames/s = env steps/s x frameskip.
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections import deque

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.text.summary_v2 import text_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from sf_engine.bottleneck import diagnose, subtract

WARMUP_SEC = 2.0  # throughput "after warm-up" starts this long after the first env step
WINDOW_SEC = 2.0  # throughput windows after warm-up (benchmarks report their median)
TENSORBOARD_EVERY_SEC = 1.0
SUMMARY_EVERY_SEC = 10.0
BOTTLENECK_EVERY_SEC = 30.0
_TRAIN_SCALARS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm",
                  "learning_rate")


def write_json_atomic(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


class RunStats:
    def __init__(self, cfg, experiment_dir: str, env_steps_base: int, frameskip: int, env_step_counters):
        self.cfg, self.dir, self.frameskip = cfg, experiment_dir, frameskip
        self.env_steps_base, self.counters = env_steps_base, env_step_counters
        self.writer = EventFileWriter(experiment_dir)
        self.start_time = time.monotonic()
        self.returns, self.lengths = deque(maxlen=100), deque(maxlen=100)
        self.episodes = 0
        self.train: dict = {}
        self.learner_samples, self.samples_dropped_lag = 0, 0
        self.lag_sum, self.lag_count, self.lag_max = 0.0, 0, 0.0
        self.stage_sec: dict = {}
        self.role_wall_sec: dict = {}  # wall seconds each role's stage seconds cover
        self.history: deque = deque()  # (time, env steps, learner samples), last 60 s
        self.first_step_time = None
        self.stopped_at: tuple | None = None
        self.warmup: tuple | None = None  # (time, env steps) where the after-warm-up window starts
        self.window_start: tuple | None = None
        self.window_rates: deque = deque(maxlen=1000)  # env steps/s of consecutive windows after warm-up
        self.last_tb = self.last_status = self.last_summary = self.start_time
        self.checkpoint_path = None
        self.eval: dict = {}
        self.diagnosis = None
        self.bottleneck_snapshot = (self.start_time, {})
        self.inference_forwards, self.inference_samples = 0, 0
        # faults and the books of env steps (sampled = trained + dropped for lag + not trainable (reset
        # steps) + recycled untrained (sampling only) + dropped with a failed worker + in flight at stop)
        self.faults: dict = {}  # (role, index) -> traceback of its latest failure, until the runner takes it
        self.worker_restarts, self.policy_worker_restarts, self.checkpoint_failures = 0, 0, 0
        self.steps_not_trainable, self.steps_recycled, self.steps_dropped_faults = 0, 0, 0
        self.steps_in_flight_at_stop = None

    @property
    def env_steps(self) -> int:
        return self.env_steps_base + int(self.counters.sum())

    @property
    def return_mean(self):
        return sum(self.returns) / len(self.returns) if self.returns else None

    def consume(self, messages: list) -> None:
        for msg in messages:
            kind = msg["kind"]
            if kind == "episodes" and self.stopped_at is None:
                self.episodes += msg["count"]
                self.returns.extend(msg["returns"])
                self.lengths.extend(msg["lengths"])
                self.stage_sec[f"rollout_worker_{msg['worker']}"] = msg["stage_sec"]
                self.role_wall_sec[f"rollout_worker_{msg['worker']}"] = msg["wall_sec"]
            elif kind == "train":
                self.train = msg
                self.learner_samples += msg["samples"]
                self.samples_dropped_lag += msg["dropped_lag"]
                self.steps_not_trainable += msg["not_trainable"]
                self.lag_sum += msg["lag_mean"] * msg["lag_count"]
                self.lag_count += msg["lag_count"]
                self.lag_max = max(self.lag_max, msg["lag_max"])
                self.stage_sec["learner"] = msg["stage_sec"]
                self.role_wall_sec["learner"] = msg["wall_sec"]
            elif kind == "inference":
                self.stage_sec["policy_worker"] = msg["stage_sec"]
                self.role_wall_sec["policy_worker"] = msg["wall_sec"]
                self.inference_forwards += msg["forwards"]
                self.inference_samples += msg["samples"]
            elif kind == "checkpoint":
                self.checkpoint_path = msg["path"]
            elif kind == "checkpoint_failed":
                self.checkpoint_failures += 1
                logging.warning("checkpoint not written (%s): the previous one is kept, training goes on",
                                msg["reason"])
            elif kind == "recycled":
                self.steps_recycled += msg["steps"]
            elif kind == "fault":
                self.faults[(msg["role"], msg["index"])] = msg["traceback"]
            elif kind == "eval":
                self.eval = msg
                logging.info("evaluation of version %d: return %.1f +- %.1f over %d episodes, %d unfinished "
                             "(best %.1f)", msg["version"], msg["return_mean"], msg["return_std"], msg["episodes"],
                             msg["unfinished"], msg["best"])

    def _rate(self, window_sec: float, column: int) -> float:
        now, newest = self.history[-1][0], self.history[-1]
        oldest = next((h for h in self.history if now - h[0] <= window_sec), newest)
        return (newest[column] - oldest[column]) / (newest[0] - oldest[0]) if newest[0] > oldest[0] else 0.0

    def tick(self) -> None:
        """Sample counters; write TensorBoard, status line and summary.json when each is due."""
        now, steps = time.monotonic(), self.env_steps
        self.history.append((now, steps, self.learner_samples))
        while now - self.history[0][0] > 60.0:
            self.history.popleft()
        if self.first_step_time is None and steps > self.env_steps_base:
            self.first_step_time = now
        elif self.warmup is None and self.first_step_time and now - self.first_step_time >= WARMUP_SEC:
            self.warmup = self.window_start = (now, steps)
            self.bottleneck_snapshot = (now, {role: dict(stages) for role, stages in self.stage_sec.items()})
        elif self.window_start and now - self.window_start[0] >= WINDOW_SEC and self.stopped_at is None:
            self.window_rates.append((steps - self.window_start[1]) / (now - self.window_start[0]))
            self.window_start = (now, steps)
        if now - self.last_tb >= TENSORBOARD_EVERY_SEC:
            self.write_tensorboard()
            self.last_tb = now
        if now - self.last_status >= self.cfg.run.status_every_sec:
            logging.info(self.status_line())
            self.last_status = now
        if now - self.last_summary >= min(SUMMARY_EVERY_SEC, self.cfg.run.status_every_sec):
            self.write_summary()
            self.last_summary = now
        if self.warmup and now - self.bottleneck_snapshot[0] >= BOTTLENECK_EVERY_SEC and self.stopped_at is None:
            self.report_bottleneck(now)

    def report_bottleneck(self, now: float) -> None:
        """Name the binding stage over the last window (terminal, TensorBoard text and scalars)."""
        then, old = self.bottleneck_snapshot
        self.diagnosis = diagnose(subtract(self.stage_sec, old), now - then)
        self.bottleneck_snapshot = (now, {role: dict(stages) for role, stages in self.stage_sec.items()})
        logging.info("bottleneck (last %.0f s): %s", now - then, self.diagnosis.message)
        values = [Summary.Value(tag=f"perf/{name}", simple_value=float(v))
                  for name, v in self.diagnosis.fractions.items()]
        summary = text_pb("perf/bottleneck", self.diagnosis.message)
        summary.value.extend(values)
        self.writer.add_event(Event(wall_time=time.time(), step=self.env_steps, summary=summary))

    def stop(self) -> None:
        """The run decided to stop: throughput and episode figures are final as of now (steps taken
        while the processes wind down still count in env_steps)."""
        self.tick()
        self.stopped_at = self.history[-1]

    def env_steps_per_sec(self) -> float:
        """From the end of warm-up to the stop (from the first env step when the run was too short)."""
        end_time, end_steps = (self.stopped_at or self.history[-1])[:2]
        start = self.warmup if self.warmup and end_time - self.warmup[0] >= WINDOW_SEC else None
        if start is None and self.first_step_time is not None:
            start = (self.first_step_time, next(h[1] for h in self.history if h[0] >= self.first_step_time))
        if start is None or end_time <= start[0]:
            return 0.0
        return (end_steps - start[1]) / (end_time - start[0])

    def scalars(self) -> dict:
        out = {"perf/env_steps_per_sec_10s": self._rate(10.0, 1), "perf/env_steps_per_sec_60s": self._rate(60.0, 1),
               "perf/learner_samples_per_sec": self._rate(10.0, 2), "train/samples_dropped_lag": self.samples_dropped_lag}
        out["perf/frames_per_sec_10s"] = out["perf/env_steps_per_sec_10s"] * self.frameskip
        if self.inference_forwards:
            out["perf/inference_batch_mean"] = self.inference_samples / self.inference_forwards
        if self.env_steps > self.env_steps_base:
            out["perf/sample_reuse"] = (self.learner_samples * self.cfg.learner.num_epochs
                                        / (self.env_steps - self.env_steps_base))
        out["perf/frames_per_sec_60s"] = out["perf/env_steps_per_sec_60s"] * self.frameskip
        out.update({"faults/worker_restarts": self.worker_restarts,
                    "faults/policy_worker_restarts": self.policy_worker_restarts,
                    "faults/checkpoint_failures": self.checkpoint_failures})
        if self.returns:
            out["episode/return"] = self.return_mean
            out["episode/length"] = sum(self.lengths) / len(self.lengths)
        if self.eval:
            out.update({"eval/return_mean": self.eval["return_mean"], "eval/return_best": self.eval["best"],
                        "eval/length_mean": self.eval["length_mean"]})
        if self.train:
            out.update({f"policy_lag/{k}": self.train[f"lag_{k}"] for k in ("min", "mean", "max")})
            out.update({f"train/{k}": self.train[k] for k in _TRAIN_SCALARS if k in self.train})
            out["train/version"] = self.train["version"]
        return out

    def write_tensorboard(self) -> None:
        values = [Summary.Value(tag=tag, simple_value=float(v)) for tag, v in self.scalars().items()]
        self.writer.add_event(Event(wall_time=time.time(), step=self.env_steps, summary=Summary(value=values)))

    def status_line(self) -> str:
        elapsed = time.monotonic() - self.start_time
        rate = self._rate(10.0, 1)
        ret = f"{self.return_mean:.1f}" if self.returns else "-"
        lag = (f"{self.train['lag_mean']:.1f}/{self.train['lag_max']:.0f}" if self.train else "-")
        line = (f"[{elapsed:6.1f}s] env steps {self.env_steps:,} | {rate:,.0f} env steps/s "
                f"({rate * self.frameskip:,.0f} frames/s, 10 s) | return {ret} (last 100 of {self.episodes:,}) "
                f"| lag mean/max {lag} | version {self.train.get('version', 0)}")
        remaining = [self.cfg.run.train_for_seconds - elapsed]
        if rate > 0:
            remaining.append((self.cfg.run.train_for_env_steps - self.env_steps) / rate)
        return line + f" | ETA {max(0.0, min(remaining)):,.0f}s"

    def summary(self) -> dict:
        steps_per_sec = self.env_steps_per_sec()
        return {
            "env": self.cfg.env.env, "mode": self.cfg.run.mode, "num_workers": self.cfg.sampler.num_workers,
            "num_envs_per_worker": self.cfg.sampler.num_envs_per_worker,
            "env_steps": self.env_steps, "frames": self.env_steps * self.frameskip,
            "wall_sec": round(time.monotonic() - self.start_time, 2),
            "env_steps_per_sec": round(steps_per_sec, 1), "frames_per_sec": round(steps_per_sec * self.frameskip, 1),
            "episode_return_mean": self.return_mean, "episodes": self.episodes,
            "policy_lag_mean": self.lag_sum / self.lag_count if self.lag_count else None,
            "policy_lag_max": self.lag_max if self.lag_count else None,
            "learner_version": self.train.get("version", 0), "learner_samples": self.learner_samples,
            "samples_dropped_lag": self.samples_dropped_lag, "stage_seconds": self.stage_sec,
            "role_wall_seconds": self.role_wall_sec,
            "bottleneck": self.diagnosis.stage if self.diagnosis else None,
            "bottleneck_report": self.diagnosis.message if self.diagnosis else None,
            "inference_batch_mean": (self.inference_samples / self.inference_forwards
                                     if self.inference_forwards else None),
            "env_steps_per_sec_windows": [round(r, 1) for r in self.window_rates],
            "checkpoint": self.checkpoint_path,
            "eval_return_mean": self.eval.get("return_mean"), "eval_return_best": self.eval.get("best"),
            "worker_restarts": self.worker_restarts, "policy_worker_restarts": self.policy_worker_restarts,
            "checkpoint_failures": self.checkpoint_failures, "env_step_books": self.books(),
        }

    def books(self) -> dict:
        """Where every env step of this run went; `unaccounted` is 0 when none was lost (known once the
        run has stopped and the steps in flight were counted)."""
        books = {"sampled": self.env_steps - self.env_steps_base, "trained": self.learner_samples,
                 "dropped_lag": self.samples_dropped_lag, "not_trainable": self.steps_not_trainable,
                 "recycled_untrained": self.steps_recycled, "dropped_faults": self.steps_dropped_faults,
                 "in_flight_at_stop": self.steps_in_flight_at_stop}
        if self.steps_in_flight_at_stop is not None:
            books["unaccounted"] = books["sampled"] - sum(v for k, v in books.items() if k != "sampled")
        return books

    def write_summary(self) -> dict:
        data = self.summary()
        write_json_atomic(os.path.join(self.dir, "summary.json"), data)
        return data

    def close(self) -> dict:
        self.tick()
        if self.diagnosis is None and self.stage_sec:  # a run shorter than one window: judge it whole
            self.diagnosis = diagnose(self.stage_sec, time.monotonic() - self.start_time)
        self.write_tensorboard()
        self.writer.close()
        return self.write_summary()
