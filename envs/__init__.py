"""Environment families for sf_engine: batched envs a rollout worker steps as one unit."""
from envs.registry import (ENVS_PER_WORKER_HINT, FAMILY_DEFAULTS, BatchEnv, EnvError, StepResult, make_batch_env, probe_env_spec,
                           register_env)

__all__ = ["ENVS_PER_WORKER_HINT", "FAMILY_DEFAULTS", "BatchEnv", "EnvError", "StepResult", "make_batch_env", "probe_env_spec",
           "register_env"]
