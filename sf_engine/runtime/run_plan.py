"""The run plan's type: what the main process resolves once (sf_engine.run.plan) and every role is built
from. Frozen; sent whole to each child process."""

from __future__ import annotations

from dataclasses import dataclass

from sf_engine.config.groups import Config
from sf_engine.envs import EnvSpec


@dataclass(frozen=True)
class Paths:
    """Where a run writes: its experiment directory, checkpoints, log and shared-memory file."""

    experiment_dir: str
    checkpoint_dir: str
    log_path: str
    shm_path: str


@dataclass(frozen=True)
class RunPlan:
    """Everything a run is, resolved once by the main process (sf_engine.run.plan.build_plan) before any
    child starts: every role is built from it, in a child process or in serial mode."""

    cfg: Config  # every 'auto' resolved
    spec: EnvSpec
    layout: dict  # shared array name -> (shape, dtype)
    paths: Paths
    resume_from: str | None  # the newest valid checkpoint (None: a fresh start or --restart)
    checkpoints_seen: tuple  # the experiment's checkpoint files when the plan was made
    env_steps_base: int  # env steps of the runs before this one
    command_line: tuple
    registered_envs: dict  # sf_engine.envs.register_env() factories of the user's script, for the children
    notes: tuple = ()  # lines that explain choices (auto sizing) and warnings, logged at start
    # (register, name, factory) calls each process makes before its role is built, with the user's factories of
    # this process that the plan names (sf_engine.model.encoders.register_encoder's of --encoder)
    registrations: tuple = ()
