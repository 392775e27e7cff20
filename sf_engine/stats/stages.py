"""Where a process's time goes: the stages of each role's loop, named once here, and the timer that books
seconds to them. The roles book to these names and the bottleneck report reads them by the same names
(sf_engine.stats.bottleneck), so a renamed stage cannot silently zero a figure there: a timer refuses a
stage it was not built with."""

from __future__ import annotations

import time
from enum import StrEnum

from sf_engine.stats.messages import Stages


class WorkerStage(StrEnum):
    """A rollout worker's loop."""

    ENV_STEP = "env_step"
    WRITE_SLOT = "write_slot"
    WAIT_ACTIONS = "wait_actions"
    WAIT_SLOT = "wait_slot"


class InferenceStage(StrEnum):
    """The policy worker's loop."""

    WAIT_REQUESTS = "wait_requests"
    GATHER = "gather"
    FORWARD = "forward"
    WRITE_RESULTS = "write_results"
    WEIGHT_RELOAD = "weight_reload"


class SamplerStage(StrEnum):
    """A device sampler's loop (device mode: env, forward pass and slot writes in one process)."""

    FORWARD = "forward"
    ENV_STEP = "env_step"
    WRITE_SLOT = "write_slot"
    WAIT_SLOT = "wait_slot"
    WEIGHT_RELOAD = "weight_reload"


class LearnerStage(StrEnum):
    """The learner's loop."""

    WAIT_DATA = "wait_data"
    BATCH_ASSEMBLY = "batch_assembly"
    TRAIN = "train"
    WEIGHT_PUBLISH = "weight_publish"
    CHECKPOINT = "checkpoint"


class ReceiverStage(StrEnum):
    """The receiver's loop (sampler nodes)."""

    WAIT_REMOTE = "wait_remote"
    FETCH = "fetch"
    WAIT_SLOT = "wait_slot"
    WRITE_SLOTS = "write_slots"
    PUBLISH_WEIGHTS = "publish_weights"


class StageTimer:
    """Seconds per stage of one process's loop, adding up to its wall time since the first `start()`:
    `start()` opens a lap, `lap(stage)` books the time since the last mark to `stage` (one of the
    stages it was built with: `StageTimer(*LearnerStage)`).
    `live`: a shared float64 [2] array (or None) where `enter(stage)` says which stage the process is in from now
    and since when, before a call that may be long (a learner's first training round can take a minute): the runner
    counts that stage's time before the lap books it (LiveStage). A lap ends what `enter` said."""

    def __init__(self, *stages: str, live=None):
        self.stage_sec = dict.fromkeys(stages, 0.0)  # keyed by the members: a lap's lookup is by identity
        self.first = None
        self._mark = 0.0
        self._live, self._position = live, {stage: i for i, stage in enumerate(stages)}

    def start(self) -> float:
        self._mark = time.monotonic()
        if self.first is None:
            self.first = self._mark
        return self._mark

    def enter(self, stage: str) -> None:
        if self._live is not None:
            self._live[1] = self._mark
            self._live[0] = self._position[stage]

    def lap(self, stage: str) -> float:
        now = time.monotonic()
        self.stage_sec[stage] += now - self._mark
        self._mark = now
        if self._live is not None:
            self._live[0] = -1
        return now

    def report(self, role: str) -> Stages:
        stage_sec = {str(stage): sec for stage, sec in self.stage_sec.items()}  # plain names in the messages
        now = time.monotonic()
        return Stages(role, stage_sec, now - (self.first or now), at=self._mark)


class LiveStage:
    """The runner's view of a process's stage now (StageTimer.enter), over the stages of `role`'s timer."""

    def __init__(self, role: str, stages: type, live):
        self.role, self.stages, self.live = role, list(stages), live

    def in_progress(self, reported_until: float) -> tuple[str, float] | None:
        """(stage, seconds in it not booked in a report up to `reported_until`), or None outside a stage entered."""
        position, since = int(self.live[0]), float(self.live[1])
        if position < 0:
            return None
        return str(self.stages[position]), max(0.0, time.monotonic() - max(since, reported_until))
