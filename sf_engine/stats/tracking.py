"""Experiment tracking in Weights & Biases (--with_wandb): the scalars TensorBoard gets, on the same
schedule (WandbRun is an observer, sf_engine.stats.observers), plus the resolved config and, at the end, the run's
summary. Runs in the main process; wandb is imported only when the flag is given.

A resumed experiment continues its W&B run: the run id is kept in <experiment>/wandb_run_id, and
--restart starts a new one. The local W&B files go to <experiment>/wandb/ (with WANDB_MODE=offline
they stay there until `wandb sync`).
"""

from __future__ import annotations

import importlib.util
import os
import re
import secrets

from sf_engine.config.groups import Config, ConfigError

_STEP = "env_steps"  # the x axis of every W&B chart (the TensorBoard step)
_TAG = re.compile(r"[^,]{1,64}")
_PROJECT = re.compile(r"[^/\\#?%:,\s]{1,128}")


def tags(cfg: Config) -> list:
    return [tag.strip() for tag in cfg.tracking.wandb_tags.split(",") if tag.strip()]


def check_tracking(cfg: Config) -> None:
    """Bad --wandb_* values and a missing wandb package, before anything on disk changes."""
    tracking = cfg.tracking
    if not tracking.with_wandb:
        return
    if importlib.util.find_spec("wandb") is None:
        raise ConfigError("--with_wandb needs the wandb package: pip install 'sf_engine[wandb]' (or drop --with_wandb)")
    if not _PROJECT.fullmatch(tracking.wandb_project):
        raise ConfigError(
            f"--wandb_project must be a name without '/\\#?%:,' or spaces (got {tracking.wandb_project!r})"
        )
    for flag in ("wandb_entity", "wandb_group"):
        value = getattr(tracking, flag)
        if value is not None and not 0 < len(value) <= 128:
            raise ConfigError(f"--{flag} must be 1 to 128 characters (got {value!r})")
    bad = [tag for tag in tags(cfg) if not _TAG.fullmatch(tag)]
    if bad:
        raise ConfigError(f"--wandb_tags: each tag must be at most 64 characters (got {bad[0]!r})")


class WandbRun:
    """One W&B run of the experiment: start() after the experiment is locked, log() the scalars,
    finish() at the end (whatever the end)."""

    def __init__(self, run):
        self.run = run

    @classmethod
    def start(cls, plan) -> "WandbRun | None":
        """The W&B run of `plan`, or None without --with_wandb. A W&B refusal (not logged in, say) is a
        one-line ConfigError."""
        cfg = plan.cfg
        if not cfg.tracking.with_wandb:
            return None
        import wandb

        id_path = os.path.join(plan.paths.experiment_dir, "wandb_run_id")
        run_id = _read_run_id(id_path) if plan.resume_from else None
        try:
            run = wandb.init(
                project=cfg.tracking.wandb_project,
                entity=cfg.tracking.wandb_entity,
                group=cfg.tracking.wandb_group,
                tags=tags(cfg),
                name=cfg.run.experiment,
                id=run_id or secrets.token_hex(6),
                resume="allow",
                dir=plan.paths.experiment_dir,
                config={**cfg.to_dict(), "command_line": list(plan.command_line)},
                settings=wandb.Settings(console="off"),
            )
        except wandb.errors.Error as exc:
            first_line = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
            raise ConfigError(
                f"--with_wandb: W&B refused the run ({first_line}); run `wandb login`, or set "
                f"WANDB_MODE=offline to log locally and `wandb sync` later"
            ) from None
        with open(id_path, "w") as f:
            f.write(run.id)
        run.define_metric(_STEP)
        run.define_metric("*", step_metric=_STEP)
        return cls(run)

    def on_report(self, figures) -> None:
        """An observer (sf_engine.stats.observers): every report's scalars, as TensorBoard gets them."""
        self.run.log({**figures.scalars, _STEP: figures["env_steps"]})

    def on_bottleneck(self, report) -> None:
        self.run.log({**{f"perf/{name}": float(v) for name, v in report.fractions.items()}, _STEP: report.env_steps})

    def finish(self, summary: dict | None, exit_code: int) -> None:
        if summary:
            self.run.summary.update(
                {
                    f"summary/{key}": value
                    for key, value in summary.items()
                    if isinstance(value, (int, float, str)) and not isinstance(value, bool)
                }
            )
        self.run.finish(exit_code=exit_code)


def _read_run_id(path: str):
    try:
        with open(path) as f:
            run_id = f.read().strip()
    except OSError:
        return None
    return run_id if re.fullmatch(r"[a-z0-9]{1,64}", run_id) else None
