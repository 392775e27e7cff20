"""The one loop that plays whole episodes outside training: periodic evaluation (sf_engine.roles.evaluator)
and replay (enjoy.py). Runs in the process that calls it, on `device`.

Envs reset on the step after an episode ends (Gymnasium 1.x / EnvPool): that step's action is
ignored and it belongs to no episode (a device env that resets on the ending step itself, envs.device, says so:
`resets_next_step` False); a recurrent state starts over from zeros with each episode.
"""

from __future__ import annotations

import numpy as np
import torch

from sf_engine.model.acting import GREEDY, PLAYING
from sf_engine.model.actor_critic import obs_tensors


@torch.no_grad()
def act(model, obs: dict, state=None, deterministic: bool = False):
    """Actions [B] outside training, through the network's `act` (sf_engine.model.acting): the most likely ones or
    the network's own samples; and the core's new state (None without a core)."""
    out = model.act(obs, state, GREEDY if deterministic else PLAYING)
    return out.actions, out.state


def play(
    model,
    env,
    episodes_per_env: int,
    deterministic: bool = True,
    max_steps: int | None = None,
    should_stop=lambda: False,
    device="cpu",
    max_episode_steps: int | None = None,
):
    """Play `episodes_per_env` whole episodes on each env of `env` (a BatchEnv made with training=False,
    whose episode_over marks the end of a whole game, E envs). Yields (env index, return, length) of each
    episode as it ends, in the user's score (the true game score on Atari). Gives up after `max_steps`
    batched steps or once `should_stop()`. An episode that reaches `max_episode_steps` is cut there and
    yielded; a single env then starts a new one (reset), an env of a larger batch plays no more."""
    obs = env.reset()
    num_envs = env.num_envs
    returns, lengths = np.zeros(num_envs), np.zeros(num_envs, np.int64)
    played = np.zeros(num_envs, np.int64)
    resetting = np.zeros(num_envs, bool)  # this step is the env's reset step
    fresh = np.zeros(num_envs, bool)  # the obs starts an episode: the state starts over
    alive = getattr(env, "alive", None)  # a multi-agent env: rows whose agent is in its game
    present = np.ones(num_envs, bool) if alive is None else alive.copy()
    state = model.initial_state(num_envs, device)
    next_step = getattr(env, "resets_next_step", True)  # else the ending step returns the new episode's obs
    steps = 0
    while (played < episodes_per_env).any() and (max_steps is None or steps < max_steps) and not should_stop():
        with torch.inference_mode():
            if state is not None and fresh.any():
                state = state * torch.as_tensor(~fresh, device=state.device).unsqueeze(-1)
            actions, state = act(model, obs_tensors(obs, device), state, deterministic)
        result = env.step(actions.cpu().numpy())
        counting = (played < episodes_per_env) & ~resetting & present  # an absent agent's row plays nothing
        returns += result.score_rewards * counting
        lengths += counting
        ended = result.episode_over & counting
        cut = counting & ~ended & (lengths >= (max_episode_steps or np.inf))
        for i in np.flatnonzero(ended | cut):
            yield int(i), float(returns[i]), int(lengths[i])
            played[i] += 1 if ended[i] or num_envs == 1 else episodes_per_env
            returns[i], lengths[i] = 0.0, 0
        now_present = present if result.alive is None else result.alive
        fresh = (resetting if next_step else ended) | (now_present & ~present)  # a returning agent starts over too
        resetting = ended if next_step else resetting
        present = now_present.copy()
        obs = result.obs
        if num_envs == 1 and cut[0] and played[0] < episodes_per_env:  # a new episode from a reset
            obs, fresh, resetting = env.reset(), np.ones(1, bool), np.zeros(1, bool)
        steps += 1
