"""Environment families for sf_engine: batched envs a rollout worker steps as one unit. Imports nothing
from sf_engine (the engine depends on envs, never the other way)."""

from .doom import reap_orphaned_games
from .families import ENVS_PER_WORKER_HINT, FAMILY_DEFAULTS, flag_defaults
from .probe import probe_env_spec
from .registry import BatchEnv, EnvError, StepResult, make_batch_env, register_env
from .spec import ActionSpec, EnvSpec


def reap_orphaned_processes() -> list:
    """Processes an env family started outside its rollout worker (VizDoom's games) that a killed worker
    left behind: killed, with their shared memory. One line per process reaped."""
    return reap_orphaned_games()


__all__ = [
    "ENVS_PER_WORKER_HINT",
    "FAMILY_DEFAULTS",
    "ActionSpec",
    "BatchEnv",
    "EnvError",
    "EnvSpec",
    "StepResult",
    "flag_defaults",
    "make_batch_env",
    "probe_env_spec",
    "reap_orphaned_processes",
    "register_env",
]
