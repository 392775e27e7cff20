"""Partially observed variants of built-in envs: the same env with some observation entries removed,
so that a policy needs memory (a recurrent core, --rnn gru|lstm) to act well.

  CartPoleNoVel-v1   CartPole-v1 observing only the cart position and the pole angle (the two
                     velocities are dropped): a feed-forward policy cannot tell which way things move.
                     PPO's defaults for it are its spec's (sf_engine/algo/ppo/spec.py).

Stepped by the base env's backend (EnvPool when it has the id), then masked, batch at a time.
"""

from __future__ import annotations

import numpy as np

# id -> (base id, indices of the base observation that are kept)
MASKED_ENVS = {"CartPoleNoVel-v1": ("CartPole-v1", (0, 2))}


class MaskedObsBatchEnv:
    """A BatchEnv whose vector observation keeps only `keep` of the base env's entries."""

    def __init__(self, base, keep: tuple):
        self._base, self._keep = base, np.asarray(keep)
        self.num_envs, self.spec = base.num_envs, base.spec

    def _mask(self, obs: dict) -> dict:
        return {"obs": np.ascontiguousarray(obs["obs"][:, self._keep])}

    def reset(self) -> dict:
        return self._mask(self._base.reset())

    def step(self, actions):
        result = self._base.step(actions)
        result.obs = self._mask(result.obs)
        return result

    def render(self):
        return self._base.render()

    @property
    def render_fps(self):
        return self._base.render_fps

    def close(self) -> None:
        self._base.close()
