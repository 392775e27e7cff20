"""Environment families for sf_engine: batched envs a rollout worker steps as one unit."""
from envs.registry import (FAMILY_DEFAULTS, BatchEnv, EnvError, StepResult, make_batch_env, probe_env_spec,
                           register_env)

__all__ = ["FAMILY_DEFAULTS", "BatchEnv", "EnvError", "StepResult", "make_batch_env", "probe_env_spec",
           "register_env"]
