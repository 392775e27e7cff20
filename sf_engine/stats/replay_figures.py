"""The replay buffer's figures (--algo dqn) as the main process shows them: the replay ratio reached against its
target, over the run and over each 10-s window once learning started, the buffer's fill and the age of what is
trained on; for TensorBoard, the status line and summary.json. Aggregates the learner's ReplayStatus messages;
no torch."""

from __future__ import annotations

import time

from sf_engine.stats.messages import ReplayStatus

WINDOW_SEC = 10.0


class ReplayFigures:
    """The latest ReplayStatus, and the replay ratio of each WINDOW_SEC window after learning started."""

    def __init__(self):
        self.latest: ReplayStatus | None = None
        self.window_start: tuple | None = None  # (time, inserted, sampled) where the current window began
        self.windows: list = []  # the replay ratio of each whole window

    def consume(self, status: ReplayStatus, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.latest = status
        if status.inserted < status.learning_starts or status.sampled == 0:
            return
        if self.window_start is None:
            self.window_start = (now, status.inserted, status.sampled)
        elif now - self.window_start[0] >= WINDOW_SEC:
            _, inserted, sampled = self.window_start
            if status.inserted > inserted:
                self.windows.append((status.sampled - sampled) / (status.inserted - inserted))
            self.window_start = (now, status.inserted, status.sampled)

    @property
    def ratio_target(self) -> float | None:
        return None if self.latest is None else self.latest.replay_ratio_target

    def scalars(self) -> dict:
        s = self.latest
        if s is None:
            return {}
        out = {
            "replay/ratio_target": s.replay_ratio_target,
            "replay/inserted_env_steps": s.inserted,
            "replay/sampled": s.sampled,
            "replay/fill": s.stored / s.capacity,
            "replay/age_mean_versions": s.age_mean,
            "replay/age_max_versions": s.age_max,
            "replay/learner_waited_sec": s.learner_waited_sec,
        }
        if s.replay_ratio is not None:
            out["replay/ratio"] = s.replay_ratio
        if self.windows:
            out["replay/ratio_10s"] = self.windows[-1]
        return out

    def status_text(self) -> str:
        """' | replay ratio 8.01/8 fill 42% age 3.1': since learning started, against the target (before it
        starts: how far the buffer is)."""
        s = self.latest
        if s is None:
            return ""
        if s.replay_ratio is None:
            return f" | replay filling {s.inserted:,}/{s.learning_starts:,} env steps before learning"
        return (
            f" | replay ratio {s.replay_ratio:.2f}/{s.replay_ratio_target:g} fill {s.stored / s.capacity:.0%} "
            f"age {s.age_mean:.1f}"
        )

    def summary(self, algo: str) -> dict:
        """summary.json's replay fields (`replay_ratio`: measured after learning started)."""
        s = self.latest
        if s is None:
            return {"algo": algo}
        return {
            "algo": algo,
            "replay_ratio": None if s.replay_ratio is None else round(s.replay_ratio, 4),
            "replay_ratio_target": s.replay_ratio_target,
            "replay_ratio_windows": [round(r, 4) for r in self.windows],
            "replay_inserted_env_steps": s.inserted,
            "replay_sampled": s.sampled,
            "replay_fill": round(s.stored / s.capacity, 4),
            "replay_age_mean_versions": s.age_mean,
            "replay_learner_waited_sec": round(s.learner_waited_sec, 2),
        }
