"""Env registry, env families and the batched-env interface.

Batched envs run in rollout workers; probing an env and its family (envs.probe) runs in the runner. A `BatchEnv`
steps `num_envs` envs at once and follows the Gymnasium 1.x / EnvPool convention: an env that ends
(terminated or truncated) is reset on the *next* step, whose action is ignored and which returns the
first observation of the new episode with reward 0. The worker marks that step invalid.

Families (each a registered EnvFamily, see envs.families; the algorithms' defaults for them are in their specs):
  atari       EnvPool Atari ids (Pong-v5, ...) and Gymnasium's ALE ids (ale_py:ALE/Pong-v5, made alike by
              envs.gym_atari): 84x84 gray, frameskip 4, 4 stacked frames, up to 30 no-op starts; for training
              also episodic life and reward clipping, while the true game score of whole games is reported.
  image       other envs with a uint8 image observation (MiniGrid-style views, ...).
  continuous  Box action spaces (EnvPool MuJoCo such as HalfCheetah-v4, or Gymnasium ids).
  doom        VizDoom scenarios by Gymnasium id or Sample Factory name (envs/doom.py): 128x72 RGB,
              frameskip 4, Sample Factory's reward scaling and shaping, conv encoder + GRU.
  turns       turn-based PettingZoo envs (AECEnv: board games such as Connect Four), in self-play.
  classic     everything else (EnvPool classic control, Gymnasium ids, user envs, PettingZoo ParallelEnvs).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import warnings
from typing import Callable

from .batch import BatchEnv, StepResult  # noqa: F401  (StepResult: the package's name for it)
from .device import DeviceBatchEnv, device_env_class, make_device_env
from .doom import DoomFactory
from .doom import missing as doom_missing
from .doom_duel import MultiplayerFactory
from .doom_scenarios import is_doom
from .doom_scenarios import scenario as doom_scenario
from .gym_atari import AtariFactory, gym_atari_id
from .masks import MaskFromInfo
from .multiagent import MultiAgentBatchEnv, is_pettingzoo_class
from .observations import FlatObservationFactory
from .partially_observed import MASKED_ENVS, MaskedObsBatchEnv
from .spec import EnvError, EnvSpec, check_same_spaces
from .user_code import import_user_module, user_attribute

_REGISTRY: dict[str, Callable] = {}


def register_env(name: str, make_env: Callable) -> None:
    """Register `make_env()` -> gymnasium.Env under `name`, usable as `--env name`. Call it before the
    engine's entry point (sf_engine.run.runner.main, or build_plan and run) in the script that starts training."""
    _REGISTRY[name] = make_env


def registered_envs() -> dict:
    """name -> factory of every register_env() call in this process (handed to rollout workers)."""
    return dict(_REGISTRY)


# ---- backends ---------------------------------------------------------------------------------
def envpool_module():
    """The envpool module, or EnvError with the install command (its wheels are for Linux x86-64)."""
    try:
        import envpool
    except ImportError as exc:
        raise EnvError(
            f"EnvPool is not installed here ({exc.__class__.__name__}): pip install envpool "
            f"(Linux x86-64), or use --env_backend gymnasium"
        ) from None
    return envpool


def envpool_ids() -> set:
    return set(envpool_module().list_all_envs())


def _is_user_class(env_id: str) -> bool:
    return ":" in env_id


@functools.lru_cache(maxsize=None)
def has_native_vector_env(env_id: str) -> bool:
    """Whether Gymnasium has a natively vectorized implementation of the registered id `env_id` (its
    `vector_entry_point`, e.g. CartPole's: the whole batch stepped by one set of NumPy array operations)
    that imports here (phys2d's need JAX) and resets ended envs on the next step, as the engine expects."""
    import gymnasium as gym
    from gymnasium.envs.registration import load_env_creator

    if env_id in _REGISTRY or _is_user_class(env_id):
        return False
    try:
        entry_point = gym.spec(env_id).vector_entry_point
        creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    except (gym.error.Error, ImportError, AttributeError):
        return False
    metadata = getattr(creator, "metadata", None) or {}
    return creator is not None and metadata.get("autoreset_mode") == gym.vector.AutoresetMode.NEXT_STEP


def may_use_envpool(env_id: str, backend: str) -> bool:
    """Whether `env_id` may be an EnvPool env, decided without importing EnvPool (slow to import)."""
    env_id = MASKED_ENVS.get(env_id, (env_id,))[0]
    if backend != "auto":
        return backend == "envpool"
    return (
        env_id not in _REGISTRY
        and not _is_user_class(env_id)
        and not has_native_vector_env(env_id)
        and not is_doom(env_id)
    )


def resolve_backend(env_id: str, backend: str) -> str:
    """'auto': 'device' for a device env (envs.device); Gymnasium's own vectorized implementation where it has one
    (CartPole: 4-10x cheaper per env step than EnvPool's, docs/performance.md), else EnvPool where it has the id, else
    Gymnasium."""
    env_id = MASKED_ENVS.get(env_id, (env_id,))[0]
    if backend != "auto":
        return backend
    if device_env_class(env_id) is not None:  # a device env: sampled in device mode (envs.device)
        return "device"
    if not may_use_envpool(env_id, backend) or importlib.util.find_spec("envpool") is None:
        return "gymnasium"  # 'auto' without EnvPool installed: Gymnasium's implementation
    return "envpool" if env_id in envpool_ids() else "gymnasium"


def _user_factory(env_id: str) -> Callable:
    """`package.module:Name` -> a zero-argument factory of gymnasium.Env: Name is a class or factory in
    the module, or a Gymnasium id that importing the module registers (e.g. minigrid:MiniGrid-Empty-5x5-v0)."""
    import gymnasium as gym

    module = import_user_module(env_id, "--env", EnvError)
    attr = env_id.partition(":")[2]
    if not hasattr(module, attr) and attr in gym.registry:
        return _GymId(attr)
    target = user_attribute(module, env_id, "--env", EnvError)
    if not callable(target):
        raise EnvError(f"--env {env_id}: {attr} is not a gymnasium.Env or PettingZoo env class or factory")
    if isinstance(target, type) and not issubclass(target, gym.Env) and not is_pettingzoo_class(target):
        raise EnvError(f"--env {env_id}: {attr} is a class but not a gymnasium.Env or a PettingZoo env")
    return target


def gym_factory(env_id: str) -> Callable:
    import gymnasium as gym

    if env_id in _REGISTRY:
        return _REGISTRY[env_id]
    if is_doom(env_id):
        reason = doom_missing(env_id)
        if reason:
            raise EnvError(reason)
        return MultiplayerFactory(env_id) if doom_scenario(env_id).players > 1 else DoomFactory(env_id)
    if gym_atari_id(env_id) and importlib.util.find_spec("ale_py") is not None:  # the Atari family's preprocessing
        return AtariFactory(gym_atari_id(env_id), training=False)
    if _is_user_class(env_id):
        return _user_factory(env_id)
    try:
        gym.spec(env_id)
    except gym.error.Error as exc:
        namespace = env_id.split("/")[0] if "/" in env_id else None
        if namespace in _NAMESPACE_PACKAGES:
            package, module = _NAMESPACE_PACKAGES[namespace]
            if importlib.util.find_spec(module) is not None:  # installed: importing it registers the ids
                raise EnvError(
                    f"--env {env_id}: pass --env {module}:{env_id}, which imports the package that registers it"
                ) from None
            raise EnvError(
                f"--env {env_id}: its package is not installed: pip install {package}, then pass "
                f"--env {module}:{env_id}"
            ) from None
        known = set(gym.registry) | set(_REGISTRY)
        if importlib.util.find_spec("envpool") is not None:
            known |= envpool_ids()
        raise EnvError(
            f"--env {env_id}: unknown environment id ({exc.__class__.__name__}){did_you_mean(env_id, known)}; "
            f"check the spelling, or name the package that registers it as --env package:{env_id}"
        ) from None
    return _GymId(env_id)


def did_you_mean(env_id: str, known) -> str:
    """', did you mean X?' for the id of `known` closest to `env_id` (case and punctuation aside), or ''."""
    import difflib

    def plain(name: str) -> str:
        return "".join(c for c in name.lower() if c.isalnum())

    by_plain = {}
    for name in sorted(known):
        by_plain.setdefault(plain(name), name)
    exact = [name for key, name in by_plain.items() if key == plain(env_id) or key.startswith(plain(env_id) + "v")]
    close = exact or [by_plain[key] for key in difflib.get_close_matches(plain(env_id), by_plain, n=1, cutoff=0.75)]
    return f", did you mean --env {max(close)}?" if close else ""


# Gymnasium namespaces whose envs a separate package registers: (pip package, module to import)
_NAMESPACE_PACKAGES = {
    "ALE": ("ale-py", "ale_py"),
    "MiniGrid": ("minigrid", "minigrid"),
    "BabyAI": ("minigrid", "minigrid"),
}


class _GymId:
    """Picklable factory of a registered Gymnasium id (importing its module first when given)."""

    def __init__(self, env_id: str):
        self.env_id = env_id

    def __call__(self, **kwargs):
        import gymnasium as gym

        return gym.make(self.env_id, **kwargs)


def _envpool_kwargs(family: str, training: bool) -> dict:
    """Atari: episodic life and reward clipping only while training (evaluation plays whole games)."""
    return {"episodic_life": training, "reward_clip": training} if family == "atari" else {}


SEED_MODULUS = 2**31 - 2**24  # env seeds: EnvPool takes int32, Gymnasium non-negative; room for 2**24 envs


def make_batch_env(
    env_id: str,
    backend: str,
    num_envs: int,
    seed: int,
    spec: EnvSpec,
    training: bool = True,
    render_mode=None,
    check: bool = True,
) -> BatchEnv:
    """Make `num_envs` envs of `env_id` stepped on one CPU thread (a worker owns one core); env i gets
    seed + i. Any integer seed works: it is taken modulo SEED_MODULUS, which every backend accepts.
    `check`: a Gymnasium env must have the spaces `spec` was probed with (EnvError otherwise)."""
    seed %= SEED_MODULUS
    if env_id in MASKED_ENVS:  # the base env's observation is wider than `spec`'s: built-in, not checked
        base_id, keep = MASKED_ENVS[env_id]
        base = make_batch_env(base_id, backend, num_envs, seed, spec, training, render_mode, check=False)
        return MaskedObsBatchEnv(base, keep)
    backend = resolve_backend(env_id, backend)
    if backend == "device":  # played outside training (evaluation, enjoy.py): on the CPU, through NumPy
        return DeviceBatchEnv(make_device_env(env_id, num_envs, "cpu"), spec, seed)
    if backend == "envpool":
        env = _envpool(env_id, num_envs, seed, spec, training)
        return BatchEnv(env, num_envs, spec, spec.family == "atari", layout=spec.layout)
    if spec.agents:  # a PettingZoo env: every agent of every game is a row
        return MultiAgentBatchEnv(gym_factory(env_id), num_envs, spec, seed, render_mode)
    import gymnasium as gym

    if render_mode is None and has_native_vector_env(env_id) and not spec.mask_from_info:  # one env, whole batch
        env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point")
    else:
        factory = gym_factory(env_id)
        if isinstance(factory, AtariFactory):
            factory = AtariFactory(factory.name, training)
        if spec.layout is not None:  # Discrete, text or nested parts: each env's observations made flat entries
            factory = FlatObservationFactory(factory, spec.layout)
        if spec.mask_from_info:
            factory = MaskFromInfo(factory, sum(spec.action.nvec))
        make = _rendering(env_id, factory, render_mode) if render_mode else factory
        env = gym.vector.SyncVectorEnv([make] * num_envs, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    env.reset(seed=seed)
    if not check:
        return BatchEnv(env, num_envs, spec, true_score_from_info=spec.family == "atari")
    try:  # a user's env may come out otherwise here than where it was probed (in another process)
        planned, spaces = (spec.obs, spec.action), (env.single_observation_space, env.single_action_space)
        check_same_spaces(env_id, planned, *spaces, f"the env made in process {os.getpid()}", "the probed env")
    except EnvError:
        env.close()
        raise
    return BatchEnv(env, num_envs, spec, true_score_from_info=spec.family == "atari")


def _envpool(env_id: str, num_envs: int, seed: int, spec: EnvSpec, training: bool):
    """EnvPool's batch of `num_envs` envs of `env_id` on one thread, env i with seed + i."""
    envpool = envpool_module()
    with warnings.catch_warnings():  # EnvPool's float64 Box bounds make Gymnasium warn on every make
        warnings.simplefilter("ignore")
        env = envpool.make(
            env_id,
            env_type="gymnasium",
            num_envs=num_envs,
            num_threads=1,
            seed=seed,
            **_envpool_kwargs(spec.family, training),
        )
        env.observation_space  # built (and cached) on first use
    return env


def _rendering(env_id: str, factory: Callable, render_mode: str) -> Callable:
    """`factory` called with `render_mode` (enjoy.py --video's 'rgb_array'); a factory without that parameter is an
    EnvError of one line saying how to give it one."""

    def make():
        try:
            return factory(render_mode=render_mode)
        except TypeError as exc:
            if "render_mode" not in str(exc):
                raise
            raise EnvError(
                f"--env {env_id}: its factory takes no render_mode, which --video passes ({render_mode!r}): give it "
                f"a render_mode=None parameter and pass it on to the env it makes"
            ) from None

    return make
