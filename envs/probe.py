"""Probing an env once, in the main process: its observation entries, action spec, family and frameskip (the
EnvSpec every role is handed), checked against what the engine handles, each refusal one line; and the lines the
start prints about how the env is made.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import warnings

from .device import device_env_class, make_device_env
from .doom import FRAME_SKIP as DOOM_FRAME_SKIP
from .doom_scenarios import is_doom
from .families import FamilyEvidence, family_of
from .gym_atari import FRAME_SKIP as ATARI_FRAME_SKIP
from .gym_atari import gym_atari_id, settings_line
from .masks import check_action_mask, mask_in_info, with_mask_space
from .multiagent import is_multiagent, probe_spaces
from .observations import observation_layout, observation_notes
from .partially_observed import MASKED_ENVS
from .registry import did_you_mean, envpool_ids, envpool_module, gym_factory, resolve_backend
from .spec import TO_MOVE_KEY, EnvError, EnvSpec, action_spec, check_same_spaces, obs_entries
from .user_code import describe_exception


def _make_probe_env(env_id: str):
    """One env of `env_id`; a Gymnasium id whose extra is not installed (Box2D, MuJoCo, ...) is one line
    with Gymnasium's install command."""
    import gymnasium as gym

    factory = gym_factory(env_id)
    try:
        return factory()
    except gym.error.DependencyNotInstalled as exc:
        raise EnvError(f"--env {env_id}: {(str(exc).splitlines() or ['a dependency is missing'])[0]}") from None
    except Exception as exc:  # a user's factory or class: its own error, where it was raised
        raise EnvError(f"--env {env_id}: making the env raised {describe_exception(exc)}") from None


def _observed(env_id: str, space, text: str, discrete: str):
    """The observation space the engine sees of an env's `space`: its ObsLayout's flat Dict of Boxes where it needs
    one (envs.observations), else `space`; and that layout (or None)."""
    layout = observation_layout(env_id, space, text, discrete)
    return (space if layout is None else layout.space), layout


def _check_gym_api(env_id: str, env, text: str, discrete: str) -> tuple:
    """reset() must return (obs, info) as in Gymnasium, the observation within observation_space, and
    the spaces must stay as they are at the next reset(); returns the first reset's info, and the observation space
    the engine sees with its layout (_observed) as the second reset left them."""
    infos, spaces = [], []
    for seed in (0, 1):
        try:
            result = env.reset(seed=seed)
        except Exception as exc:  # a user's env: any failure is reported as such
            raise EnvError(f"--env {env_id}: reset() raised {describe_exception(exc)}") from None
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict)):
            raise EnvError(
                f"--env {env_id}: reset() must return (observation, info dict) as in Gymnasium, "
                f"got {type(result).__name__}"
            )
        if not env.observation_space.contains(result[0]):
            raise EnvError(f"--env {env_id}: reset() returned an observation outside observation_space")
        infos.append(result[1])
        observed, layout = _observed(env_id, env.observation_space, text, discrete)
        spaces.append((obs_entries(env_id, observed), action_spec(env_id, env.action_space)))
    check_same_spaces(env_id, spaces[0], observed, env.action_space, "the second reset()", "the first")
    return infos[0], observed, layout


def env_notes(env_id: str, spec: EnvSpec) -> list:
    """The lines the start prints about how the env is made: its observation parts made vectors, and a Gymnasium ALE
    id's Atari preprocessing (and EnvPool's id of the same game)."""
    atari = [settings_line(env_id)] if spec.family == "atari" and gym_atari_id(env_id) else []
    device = (
        [
            f"{env_id} is a device env: device mode, the env, the acting network and the slots in one sampler process "
            f"per env batch on --device, no rollout or policy workers"
        ]
        if spec.device
        else []
    )
    return observation_notes(env_id, spec) + atari + device


@dataclasses.dataclass
class _Probed:
    """What one probed env says of itself, before the engine reads it as an EnvSpec."""

    obs_space: object
    action_space: object
    info: dict | None = None  # the first reset's info (a Gymnasium env's; its action mask may be there)
    agents: tuple = ()
    turn_based: bool = False
    layout: object = None
    atari: bool = False
    frameskip: int = 1


def _probe_envpool(env_id: str, text: str, discrete: str) -> _Probed:
    envpool = envpool_module()
    if env_id not in envpool_ids():
        raise EnvError(
            f"--env {env_id}: EnvPool has no such id{did_you_mean(env_id, envpool_ids())} "
            f"(use --env_backend gymnasium for Gymnasium ids)"
        )
    with warnings.catch_warnings():  # its spaces' float64 bounds cast to float32: Gymnasium's warning, not the user's
        warnings.simplefilter("ignore")
        pool_spec = envpool.make_spec(env_id)
        obs_space, action_space = pool_spec.observation_space, pool_spec.action_space
    atari = type(pool_spec).__name__ == "AtariEnvSpec"  # VizDoom has episodic_life too
    frameskip = int(pool_spec.config.frame_skip) if atari else 1
    obs_space, layout = _observed(env_id, obs_space, text, discrete)  # Dict parts (MiniGrid's direction) made flat
    return _Probed(obs_space, action_space, layout=layout, atari=atari, frameskip=frameskip)


def _probe_gymnasium(env_id: str, text: str, discrete: str) -> _Probed:
    env = _make_probe_env(env_id)
    try:
        if is_multiagent(env):
            obs_space, action_space, agents, turn_based = probe_spaces(env_id, env, EnvError)
            obs_space, layout = _observed(env_id, obs_space, text, discrete)
            probed = _Probed(obs_space, action_space, agents=agents, turn_based=turn_based, layout=layout)
        else:
            info, obs_space, layout = _check_gym_api(env_id, env, text, discrete)
            probed = _Probed(obs_space, env.action_space, info=info, layout=layout)
    finally:
        env.close()
    probed.atari = gym_atari_id(env_id) is not None and importlib.util.find_spec("ale_py") is not None
    probed.frameskip = ATARI_FRAME_SKIP if probed.atari else (DOOM_FRAME_SKIP if is_doom(env_id) else 1)
    return probed


def _probe_device(env_id: str) -> EnvSpec:
    """A device env's spec, from two of its envs made on the CPU (envs.device)."""
    env = make_device_env(env_id, 2, "cpu")
    try:
        action = action_spec(env_id, env.single_action_space)
        obs = obs_entries(env_id, env.single_observation_space)
    finally:
        env.close()
    spec = EnvSpec(obs=obs, action=action, device=True)
    return dataclasses.replace(spec, family=family_of(FamilyEvidence(env_id, spec)))


def probe_env_spec(env_id: str, backend: str, text: str = "bag", discrete: str = "onehot") -> EnvSpec:
    """Observation entries, action spec and family, checked against what the engine handles. `text` and `discrete`:
    what becomes of a Dict observation's text and Discrete parts (--text_obs, --discrete_obs: envs.observations)."""
    device = env_id not in MASKED_ENVS and device_env_class(env_id) is not None
    if device or backend == "device":
        if not device:
            raise EnvError(
                f"--env_backend device: --env {env_id} is not a device env (a VectorEnv of torch tensors, "
                f"docs/environments.md#device-envs): use --env_backend auto"
            )
        if backend not in ("auto", "device"):
            raise EnvError(f"--env {env_id} is a device env: it runs with --env_backend auto or device, not {backend}")
        return _probe_device(env_id)
    if env_id in MASKED_ENVS:
        base_id, keep = MASKED_ENVS[env_id]
        base = probe_env_spec(base_id, backend)
        ((key, _, dtype),) = base.obs
        return EnvSpec(
            obs=((key, (len(keep),), dtype),), action=base.action, family=base.family, frameskip=base.frameskip
        )
    envpool = resolve_backend(env_id, backend) == "envpool"
    probed = _probe_envpool(env_id, text, discrete) if envpool else _probe_gymnasium(env_id, text, discrete)
    action, obs_space = action_spec(env_id, probed.action_space), probed.obs_space
    info = probed.info
    from_info = info is not None and mask_in_info(env_id, obs_space, info, sum(action.nvec), EnvError)
    if from_info:  # the env's info['action_mask'] becomes an observation entry
        obs_space = with_mask_space(obs_space, sum(action.nvec))
    obs = obs_entries(env_id, obs_space)
    if probed.turn_based:  # whose turn it is: the policy and value see it (a board alone may not say it)
        obs += ((TO_MOVE_KEY, (1,), "float32"),)
    spec = EnvSpec(
        obs=obs,
        action=action,
        frameskip=probed.frameskip,
        mask_from_info=from_info,
        agents=probed.agents,
        turn_based=probed.turn_based,
        layout=probed.layout,
    )
    check_action_mask(env_id, spec, EnvError)
    return dataclasses.replace(spec, family=family_of(FamilyEvidence(env_id, spec, probed.atari)))
