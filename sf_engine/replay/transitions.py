"""n-step transitions (sf_engine.TRANSITIONS: the DQN family's, SAC's, TD3's, ...), a replay transform
(sf_engine.replay.transform): as a slot goes in, each step's n-step return, its steps and discount
(sf_engine.algo.value_targets.n_step_transitions: no window crosses an episode's end or a reset) and whether it may
be trained on are kept beside the raw steps; transition (column c, row t) is obs row t, its action, that return and
discount, and the next observation, row t + steps, of the same column. Transitions that may not be trained on
(reset steps, skipped steps) are never drawn. Runs in the learner process (the layout in the main process).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sf_engine.replay.transform import SlotSteps


@dataclass
class ReplaySample:
    """A drawn minibatch (NumPy, copies): obs / next_obs key -> [B, *shape] (stored dtype), actions [B, ...],
    returns and discounts [B] float32, weights [B] float32 (importance weights; 1 without priorities),
    policy_version [B] int64 (the version that acted), indices [B] int64 (flat, for update_priorities)."""

    obs: dict
    actions: np.ndarray
    returns: np.ndarray
    discounts: np.ndarray
    next_obs: dict
    weights: np.ndarray
    policy_version: np.ndarray
    indices: np.ndarray


class NStepTransitions:
    """Its arrays, each [C, T]: returns float32 (the n-step discounted rewards), steps int16 (n: the next observation
    is row t + n), discounts float32 (gamma ** n, 0 after a terminated step), trainable bool."""

    steps_per_sample = 1

    def __init__(self, gamma: float, n_step: int):
        self.gamma, self.n_step = gamma, n_step

    @classmethod
    def from_config(cls, cfg) -> NStepTransitions:
        return cls(cfg.learner.gamma, cfg.replay.n_step)

    @staticmethod
    def check(cfg) -> None:
        pass  # any --n_step >= 1 (the common checks): a window is cut at the slot's end

    def arrays(self, columns: int, rollout: int, state: int) -> dict:
        steps = (columns, rollout)
        return {
            "returns": (steps, "float32"),
            "steps": (steps, "int16"),
            "discounts": (steps, "float32"),
            "trainable": (steps, "bool"),
        }

    def rows(self, rollout: int) -> np.ndarray:
        return np.arange(rollout, dtype=np.int64)

    def insert(self, arrays: dict, columns: np.ndarray, steps: SlotSteps) -> np.ndarray:
        from sf_engine.algo.value_targets import n_step_transitions  # torch's module: the learner's, not the layout's

        targets = n_step_transitions(
            steps.rewards, steps.terminated, steps.truncated, steps.valid, self.gamma, self.n_step
        )
        arrays["returns"][columns] = targets.returns.T
        arrays["steps"][columns] = targets.steps.T
        arrays["discounts"][columns] = targets.discounts.T
        arrays["trainable"][columns] = targets.trainable.T
        return targets.trainable.T

    def samplable(self, arrays: dict, indices: np.ndarray) -> np.ndarray:
        return arrays["trainable"].reshape(-1)[indices]

    def cut(self, arrays: dict, obs: dict, indices: np.ndarray, weights: np.ndarray) -> ReplaySample:
        columns, rows = np.divmod(indices, arrays["trainable"].shape[1])
        next_rows = rows + arrays["steps"][columns, rows]
        return ReplaySample(
            obs={key: take(array, columns, rows) for key, array in obs.items()},
            actions=arrays["actions"][columns, rows],
            returns=arrays["returns"][columns, rows],
            discounts=arrays["discounts"][columns, rows],
            next_obs={key: take(array, columns, next_rows) for key, array in obs.items()},
            weights=weights.astype(np.float32),
            policy_version=arrays["policy_version"][columns, rows],
            indices=indices,
        )

    def batch(self, sample: ReplaySample, tensor, discrete: bool):
        from sf_engine.algo.batch import ReplayBatch

        return ReplayBatch(
            obs={key: tensor(value) for key, value in sample.obs.items()},
            actions=tensor(sample.actions.astype(np.int64, copy=False)).reshape(-1)
            if discrete
            else tensor(sample.actions),
            returns=tensor(sample.returns),
            discounts=tensor(sample.discounts),
            next_obs={key: tensor(value) for key, value in sample.next_obs.items()},
            weights=tensor(sample.weights),
        )


def take(array, columns: np.ndarray, rows: np.ndarray):
    """array[columns, rows]: a NumPy array's, or a tensor's gathered on its device (device mode's observations)."""
    if isinstance(array, np.ndarray):
        return array[columns, rows]
    import torch

    return array[torch.as_tensor(columns, device=array.device), torch.as_tensor(rows, device=array.device)]
