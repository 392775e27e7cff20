"""Environment families for sf_engine: batched envs a rollout worker steps as one unit."""
from envs.registry import BatchEnv, EnvError, make_batch_env, probe_env_spec, register_env

__all__ = ["BatchEnv", "EnvError", "make_batch_env", "probe_env_spec", "register_env"]
