"""Observers of a run: the objects the main process hands the run's figures to. An observer has any of these
methods, the hooks (sf_engine.train(observers=[...]) takes a user's; docs/api.md):

- `on_report(figures)`: at every report (every second, and once more at the end with `figures.final`
  True), `figures` a dict with the fields of summary.json, plus `figures.scalars` (TensorBoard's tags and
  values) and `figures.status` (the terminal's status line). Returning True asks the run to stop cleanly,
  as a reached budget does.
- `on_checkpoint(path)`: a checkpoint was written.
- `on_evaluation(figures)`: a greedy evaluation ended (its version, return_mean, return_std, ...).
- `on_bottleneck(report)`: the bottleneck report (a Bottleneck), every 30 s after the warm-up.

`Observer` (sf_engine.Observer) is their base, each hook a no-op; an object of another class with some of the
hooks is an observer too. A user's observer with a method `on_...` that is no hook (a misspelled one, never
called) is refused in one line before the run starts (check_observers).

The terminal, TensorBoard, summary.json and W&B (sf_engine.stats.tracking) are observers too, so a user's
observer sees what they show. Runs in the main process.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import os
import time
from dataclasses import dataclass

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.text.summary_v2 import text_pb

from sf_engine.config.fields import ConfigError
from sf_engine.stats.records import EventLog, keep_record, write_json_atomic

SUMMARY_EVERY_SEC = 10.0
HOOKS = ("on_report", "on_checkpoint", "on_evaluation", "on_bottleneck")


class Figures(dict):
    """A report's figures: summary.json's fields as a dict; `scalars`, TensorBoard's tag -> value; `status`,
    the status line; `final`, whether this is the report of the stopped run."""

    def __init__(self, fields: dict, scalars: dict, status: str, final: bool = False):
        super().__init__(fields)
        self.scalars, self.status, self.final = scalars, status, final


@dataclass(frozen=True)
class Bottleneck:
    """The bottleneck report over the last `window_sec`: its one-line `message`, the stages' `fractions`
    of the window, each policy's part of the learner and policy worker ('' with one policy), at `env_steps`."""

    message: str
    fractions: dict
    window_sec: float
    policy_shares: str
    env_steps: int


class Observer:
    """The base of an observer: override the hooks it needs, the others do nothing. Its hooks run in the main
    process (the calling one, in sf_engine.train), between the run's other work."""

    def on_report(self, figures: Figures) -> bool | None:
        """Every report (every second, and once more at the end with `figures.final` True): summary.json's
        fields, `figures.scalars` and `figures.status`. True asks the run to stop cleanly."""
        return None

    def on_checkpoint(self, path: str) -> None:
        """A checkpoint was written at `path`."""

    def on_evaluation(self, figures: dict) -> None:
        """A greedy evaluation ended: its version, return_mean, return_std, length_mean, episodes, ..."""

    def on_bottleneck(self, report: Bottleneck) -> None:
        """The bottleneck report, every 30 s after the warm-up."""


def check_observers(observers) -> list:
    """The user's observers as a list, or a one-line ConfigError naming an observer's method `on_...` that is no
    hook (never called: a misspelling) and the closest hook. Runs in the main process, as sf_engine.train takes
    them, before anything on disk changes."""
    observers = list(observers)
    for observer in observers:
        for name in dir(observer):
            if not name.startswith("on_") or name in HOOKS:
                continue
            value = inspect.getattr_static(observer, name, None)
            if callable(value) or isinstance(value, (staticmethod, classmethod)):
                closest = difflib.get_close_matches(name, HOOKS, n=1, cutoff=0.0)[0]
                raise ConfigError(
                    f"observer {type(observer).__name__}.{name} is no observer hook ({', '.join(HOOKS)}), so it "
                    f"would never be called: did you mean {closest}?"
                )
    return observers


class Observers:
    """Calls every observer's method of a name, in order. A method that raises is logged with its traceback,
    that observer is called no more and the run is asked to stop (`error` keeps the exception, for
    sf_engine.train to raise once the run has stopped); on_report returning True asks the run to stop."""

    def __init__(self, built_in: list, users: list):
        self.built_in, self.observers = built_in, built_in + list(users)
        self.stop_reason, self.error = None, None

    def notify(self, method: str, *args) -> None:
        for observer in list(self.observers):
            call = getattr(observer, method, None)
            if call is None:
                continue
            try:
                asked = call(*args)
            except Exception as exc:
                logging.exception("observer %s failed in %s", type(observer).__name__, method)
                self.observers.remove(observer)
                self.error = self.error or exc
                self.stop_reason = self.stop_reason or (
                    f"observer {type(observer).__name__}.{method} raised {type(exc).__name__}: {exc}"
                )
                continue
            if method == "on_report" and asked is True and self.stop_reason is None:
                self.stop_reason = f"observer {type(observer).__name__} asked to stop"

    def close(self) -> None:
        """The built-in observers' files closed (a user's observer has no close to call)."""
        for observer in self.built_in:
            getattr(observer, "close", lambda: None)()


class TerminalObserver(Observer):
    """The terminal and train.log: the status line every --status_every_sec, each evaluation, the
    bottleneck report."""

    def __init__(self, status_every_sec: float):
        self.every_sec, self.last = status_every_sec, time.monotonic()

    def on_report(self, figures: Figures) -> None:
        if not figures.final and time.monotonic() - self.last >= self.every_sec:
            logging.info(figures.status)
            self.last = time.monotonic()

    def on_evaluation(self, m: dict) -> None:
        rates = (
            ""
            if m["win_rate"] is None
            else f"; against a random player: won {m['win_rate']:.1%}, drew {m['draw_rate']:.1%}, "
            f"lost {m['loss_rate']:.1%}"
        )
        logging.info(
            "evaluation of version %d: return %.1f +- %.1f over %d episodes, %d unfinished (best %.1f)%s",
            *(m[key] for key in ("version", "return_mean", "return_std", "episodes", "unfinished", "best")),
            rates,
        )

    def on_bottleneck(self, report: Bottleneck) -> None:
        logging.info("bottleneck (last %.0f s): %s", report.window_sec, report.message)
        if report.policy_shares:
            logging.info("each policy's part since the start: %s", report.policy_shares)


class TensorBoardObserver(Observer):
    """TensorBoard's events in the experiment directory: every report's scalars, the bottleneck report."""

    def __init__(self, experiment_dir: str):
        self.events = EventLog(experiment_dir)

    def on_report(self, figures: Figures) -> None:
        values = [Summary.Value(tag=tag, simple_value=float(v)) for tag, v in figures.scalars.items()]
        self.events.add(Event(wall_time=time.time(), step=figures["env_steps"], summary=Summary(value=values)))

    def on_bottleneck(self, report: Bottleneck) -> None:
        summary_pb = text_pb("perf/bottleneck", report.message)
        summary_pb.value.extend(
            Summary.Value(tag=f"perf/{name}", simple_value=float(v)) for name, v in report.fractions.items()
        )
        self.events.add(Event(wall_time=time.time(), step=report.env_steps, summary=summary_pb))

    def close(self) -> None:
        self.events.close()


class SummaryFile(Observer):
    """summary.json every `every_sec` (10 s, or the status period if shorter) and at the end."""

    def __init__(self, experiment_dir: str, every_sec: float):
        self.path, self.every_sec, self.last = os.path.join(experiment_dir, "summary.json"), every_sec, time.monotonic()

    def on_report(self, figures: Figures) -> None:
        if figures.final or time.monotonic() - self.last >= self.every_sec:
            keep_record("summary.json", lambda: write_json_atomic(self.path, dict(figures)))
            self.last = time.monotonic()
