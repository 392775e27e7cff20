"""sf_engine.load_policy: a trained agent in a user's own code. A Policy computes the actions of a batch of
observations as the env gives them, for every algorithm (the actor-critic, the Q-network, SAC's actor), with the
run's observation normalization (it travels with the weights), a recurrent state per row, and the env's action
masks. Runs in the user's process. Nothing in a checkpoint can run code (sf_engine.runtime.checkpoint).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from sf_engine.envs.spec import ACTION_MASK_KEY
from sf_engine.model.actor_critic import obs_tensors
from sf_engine.play.episodes import act
from sf_engine.play.loading import LoadError, load_experiment, resolve_checkpoint
from sf_engine.play.loading import load_policy as load_model
from sf_engine.runtime.device import resolve_device


class Policy:
    """A trained agent: `act(obs)` -> the env's actions for a batch of observations. `spec`: the env's
    observation entries and action space (sf_engine.envs.EnvSpec); `checkpoint`: the weights' file."""

    def __init__(self, model, spec, device: str, checkpoint: str):
        self.model, self.spec, self.device, self.checkpoint = model, spec, device, checkpoint
        self.state = None  # a recurrent model's state [B, state_size], per row of the last batch

    @property
    def recurrent(self) -> bool:
        return self.model.initial_state(1) is not None

    def reset(self, rows=None) -> None:
        """Start the recurrent state over: of every row, or of the rows where `rows` (a bool array [B]) is True
        (the envs whose episode ended). No effect on a feed-forward policy."""
        if self.state is None or rows is None:
            self.state = None
            return
        keep = torch.as_tensor(~np.asarray(rows, bool), device=self.state.device).unsqueeze(-1)
        self.state = self.state * keep

    def act(self, obs, deterministic: bool = True, action_mask=None) -> np.ndarray:
        """The actions [B, ...] for `obs`, a batch of observations (batch first): an array, or a dict of arrays
        for a Dict observation space. `deterministic`: the most likely actions (greedy for a Q-network), else
        samples. `action_mask` [B, n]: the legal actions (1 legal) of an env that gives them in its info rather
        than in its observation. A recurrent policy carries its state per row from call to call (reset())."""
        batch = self._batch(obs, action_mask)
        rows = len(next(iter(batch.values())))
        if self.state is None or self.state.shape[0] != rows:
            self.state = self.model.initial_state(rows, self.device)
        with torch.inference_mode():
            actions, self.state = act(self.model, obs_tensors(batch, self.device), self.state, deterministic)
        return self.spec.action.env_actions(actions.cpu().numpy())

    def _batch(self, obs, action_mask) -> dict:
        """The observations as the model's entries (key -> [B, *shape] in the stored dtype), or a ValueError of
        one line saying what does not fit."""
        if self.spec.layout is not None and isinstance(obs, dict):  # the env's own parts (Discrete, text, nested)
            obs = self.spec.layout.batch(obs)
        given = dict(obs) if isinstance(obs, dict) else {"obs": obs}
        if action_mask is not None:
            given[ACTION_MASK_KEY] = action_mask
        batch, rows = {}, set()
        for key, shape, dtype in self.spec.obs:
            if key not in given:
                what = "pass action_mask=info['action_mask']" if key == ACTION_MASK_KEY else "give every entry"
                raise ValueError(f"observation entry {key!r} missing (the policy takes {self._entries()}): {what}")
            value = np.asarray(given[key], dtype)
            if value.shape[1:] != tuple(shape):
                single = " (one observation: add the batch dimension, obs[None])" if value.shape == tuple(shape) else ""
                raise ValueError(
                    f"observation entry {key!r} has shape {list(value.shape)} where the policy takes "
                    f"[batch, {', '.join(map(str, shape))}]{single}"
                )
            batch[key] = value
            rows.add(value.shape[0])
        if len(rows) != 1:
            raise ValueError(f"the observation entries have different batch sizes: {sorted(rows)}")
        return batch

    def _entries(self) -> str:
        return ", ".join(f"{key} {list(shape)}" for key, shape, _ in self.spec.obs)


def load_policy(path: str, device: str = "cpu") -> Policy:
    """The trained agent of `path`: an experiment directory (its newest valid checkpoint) or a checkpoint file
    of one. Raises sf_engine.LoadError with one line saying what is wrong. Envs and encoders the
    run registered (register_env, register_encoder) must be registered again before this call."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        experiment_dir, checkpoint = path, None
    elif os.path.isfile(path):
        experiment_dir, checkpoint = os.path.dirname(os.path.dirname(path)), path
    else:
        raise LoadError(f"{path}: no such experiment directory or checkpoint file")
    train_dir, experiment = os.path.split(experiment_dir)
    cfg, spec, exp_dir = load_experiment(train_dir, experiment)
    checkpoint = checkpoint or resolve_checkpoint(exp_dir, experiment, "latest")
    device = resolve_device(device)
    return Policy(load_model(cfg, spec, checkpoint, device), spec, device, checkpoint)
