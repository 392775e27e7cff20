"""Environment families for sf_engine: batched envs a rollout worker steps as one unit. Imports nothing
from sf_engine (the engine depends on envs, never the other way)."""

from .doom import reap_orphaned_games
from .families import EnvFamily, FamilyEvidence, family, flag_defaults, register_family, registered_families
from .probe import probe_env_spec
from .registry import BatchEnv, EnvError, StepResult, make_batch_env, register_env
from .spec import ActionSpec, EnvSpec


def reap_orphaned_processes() -> list:
    """Processes an env family started outside its rollout worker (VizDoom's games) that a killed worker
    left behind: killed, with their shared memory. One line per process reaped."""
    return reap_orphaned_games()


__all__ = [
    "ActionSpec",
    "BatchEnv",
    "EnvError",
    "EnvFamily",
    "EnvSpec",
    "FamilyEvidence",
    "StepResult",
    "family",
    "flag_defaults",
    "make_batch_env",
    "probe_env_spec",
    "reap_orphaned_processes",
    "register_env",
    "register_family",
    "registered_families",
]
