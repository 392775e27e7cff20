"""The `tracking` group of the configuration: where a run's scalars and config go besides TensorBoard, Weights &
Biases (sf_engine.stats.tracking; sf_engine.config.groups imports it into its GROUPS like every group)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sf_engine.config.fields import flag_field as _f


@dataclass(frozen=True)
class TrackingConfig:
    with_wandb: bool = _f(
        False,
        "Also log the TensorBoard scalars and the config to Weights & Biases (pip install "
        "'sf_engine[wandb]'; `wandb login` first, or WANDB_MODE=offline).",
    )
    wandb_project: str = _f("sf_engine", "W&B project of the run.")
    wandb_entity: Optional[str] = _f(
        None, "W&B team or user the project belongs to (default: your W&B default).", type=str
    )
    wandb_group: Optional[str] = _f(
        None, "W&B group of the run (default: none), to compare runs side by side.", type=str
    )
    wandb_tags: str = _f("", "Comma-separated W&B tags of the run, e.g. pong,baseline.")
