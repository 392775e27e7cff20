"""A batch of envs stepped as one (an EnvPool instance or a Gymnasium vector env) and what one
batched step returns."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gymnasium.vector import AutoresetMode

from .spec import EnvSpec

# the ways a batch of envs may reset an ended env that the engine takes (envs.device says what each means)
AUTORESET_MODES = (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP)


@dataclass
class StepResult:
    """One batched step. obs: dict key -> [E, *shape]; the rest [E]. `rewards`/`terminated` are what
    training sees (clipped rewards, life loss on Atari); `score_rewards`/`episode_over` are what the
    reported episode returns add up (the true game score of whole games). `extra_stats`: name -> values
    of the episodes that ended this step with an info["episode_extra_stats"] dict (Sample Factory's
    convention: frags, deaths, true_objective, ...), or None."""

    obs: dict
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    score_rewards: np.ndarray
    episode_over: np.ndarray
    extra_stats: dict | None = None
    alive: np.ndarray | None = None  # multi-agent: the row's agent is in its game at `obs` (envs.multiagent)
    acting: np.ndarray | None = None  # multi-agent: it is the row's agent's turn at `obs`
    objective: np.ndarray | None = None  # [E]: the true_objective of episodes that ended, NaN elsewhere


def _extra_stats(info: dict):
    """name -> list of values from a vector env's merged info["episode_extra_stats"] (each name's values
    under the mask '_' + name, Gymnasium's layout), or None where no episode reported any."""
    extra = info.get("episode_extra_stats")
    if not isinstance(extra, dict):
        return None
    out = {}
    for name, values in extra.items():
        mask = extra.get("_" + name)
        if name.startswith("_") or mask is None or not np.any(mask):
            continue
        out[name] = np.asarray(values, np.float64)[np.asarray(mask, bool)].tolist()
    return out or None


def _as_dict(obs) -> dict:
    return obs if isinstance(obs, dict) else {"obs": obs}


class BatchEnv:
    """`num_envs` envs stepped as one batch (an EnvPool instance or a Gymnasium vector env)."""

    resets_next_step = True  # an env that ends resets on the next step, which belongs to no episode

    def __init__(self, env, num_envs: int, spec: EnvSpec, true_score_from_info: bool = False, layout=None):
        """`layout`: the envs.observations.ObsLayout that makes the whole batch's observations flat entries (EnvPool's
        Dict observations with Discrete parts; a Gymnasium env's are made so env by env)."""
        self._env, self.num_envs, self.spec = env, num_envs, spec
        self._true_score = true_score_from_info
        self._entries = _as_dict if layout is None else layout.batch

    def reset(self) -> dict:
        obs, _ = self._env.reset()
        return self._entries(obs)

    def step(self, actions: np.ndarray) -> StepResult:
        actions = self.spec.action.env_actions(actions)  # clipped, or from Discrete(n, start=k)'s k
        obs, rewards, terminated, truncated, info = self._env.step(actions)
        if self._true_score:
            score, over = info["reward"], np.logical_or(info["terminated"].astype(bool), truncated)
        else:
            score, over = rewards, np.logical_or(terminated, truncated)
        extra = _extra_stats(info)
        objective = None
        stats = info.get("episode_extra_stats") if extra and "true_objective" in extra else None
        if stats is not None:  # PBT's objective where the env gives one (Sample Factory's convention)
            objective = np.full(self.num_envs, np.nan)
            objective[np.asarray(stats["_true_objective"], bool)] = extra["true_objective"]
        return StepResult(self._entries(obs), rewards, terminated, truncated, score, over, extra, objective=objective)

    def render(self):
        return self._env.render()

    @property
    def render_fps(self):
        """The frame rate the env renders at (Gymnasium's metadata), or None when it says none."""
        return getattr(self._env, "metadata", {}).get("render_fps")

    def close(self) -> None:
        self._env.close()
