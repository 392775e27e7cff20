"""The trajectory batch: what a trajectory slot holds, and so what the shared buffers lay out, what a
learning algorithm trains on and what a slot carries on the wire (sf_engine.scaleout.slot_transport).

SLOT_FIELDS names every field of a slot besides the observations, with its rows and dtype; the buffers
(sf_engine.runtime.shared_buffers.buffer_layout), the learner's TrajectoryBatch and the wire format all
derive from it. Shapes: S = slots, T = rollout, E = envs per split in the buffers; in a batch the slots'
rows are side by side, time-major: [T(+1), N = slots x E, ...].

No torch here: the main process lays out the buffers without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

STEP, BOOTSTRAP = "step", "bootstrap"  # a field's rows per slot: T steps, or T + 1 (the bootstrap row too)
ALWAYS, TURN_BASED, SEVERAL_POLICIES, RECURRENT = "always", "turn_based", "several_policies", "recurrent"


@dataclass(frozen=True)
class SlotField:
    """One field of a trajectory slot: `rows` STEP or BOOTSTRAP; `dtype` None for the env's action dtype;
    `present` in which runs it exists (ALWAYS, or TURN_BASED, SEVERAL_POLICIES, RECURRENT runs); `finite`:
    a float that a slot from elsewhere must hold finite (a NaN there would poison a whole batch)."""

    name: str
    rows: str
    dtype: str | None
    present: str = ALWAYS
    finite: bool = False


SLOT_FIELDS = (
    SlotField("actions", STEP, None),  # [.., *action_shape]: int64 (discrete) or float32 (unclipped sample)
    SlotField("log_probs", STEP, "float32", finite=True),  # behaviour log-probability of the action
    SlotField("values", STEP, "float32", finite=True),  # behaviour value estimate
    SlotField("policy_version", STEP, "int64"),  # version of the policy that acted
    SlotField("rewards", STEP, "float32", finite=True),
    SlotField("terminated", STEP, "bool"),  # the MDP ended the episode (no bootstrap)
    SlotField("truncated", STEP, "bool"),  # a time limit cut it (bootstrap from the last obs)
    SlotField("valid", STEP, "bool"),  # False on the reset step after an episode end and on absent agents' rows
    SlotField("non_finite", STEP, "bool"),  # skipped: a non-finite obs, reward or action (valid is False too)
    SlotField("acting", STEP, "bool", TURN_BASED),  # the row's agent was to move: only these steps train its policy
    SlotField("policy_id", BOOTSTRAP, "int16", SEVERAL_POLICIES),  # the policy that plays the row's episode
    SlotField("episode_start", BOOTSTRAP, "bool", RECURRENT),  # the obs starts an episode: the state is zeroed
    SlotField("rnn_states", BOOTSTRAP, "float32", RECURRENT, finite=True),  # [.., H] state acted from
)


@dataclass
class TrajectoryBatch:
    """Whole trajectory slots side by side, time-major, on the learner's device: `obs` key -> [T+1, N,
    *shape] (row T bootstraps), the step fields [T, N] (`actions` [T, N, *action_shape]); the fields of
    SLOT_FIELDS that a run lacks are None. N = slots x envs per split trajectories."""

    obs: dict
    actions: Tensor
    log_probs: Tensor
    values: Tensor
    policy_version: Tensor
    rewards: Tensor
    terminated: Tensor
    truncated: Tensor
    valid: Tensor
    non_finite: Tensor  # [T, N]: the steps skipped for a non-finite value (not trainable, booked apart)
    acting: Tensor | None = None  # [T, N], turn-based games
    policy_id: Tensor | None = None  # [T+1, N], several policies or an opponent pool
    episode_start: Tensor | None = None  # [T+1, N], a recurrent core
    rnn_states: Tensor | None = None  # [T+1, N, H], a recurrent core
    keep: Tensor | None = None  # [T, N]: the samples the policy handed this batch trains on (the learner's mark)

    @property
    def dones(self) -> Tensor:
        return self.terminated | self.truncated


@dataclass
class ReplayBatch:
    """A minibatch sampled from the replay buffer, on the learner's device (B = batch): obs / next_obs key ->
    [B, *shape] in the stored dtype, actions [B] int64 (discrete) or [B, A] float32 (Box), returns [B] (the n-step
    discounted rewards), discounts [B] (gamma ** n, 0 after a terminated step), weights [B] (importance weights of
    prioritized replay, else 1)."""

    obs: dict
    actions: Tensor
    returns: Tensor
    discounts: Tensor
    next_obs: dict
    weights: Tensor


@dataclass
class SequenceBatch:
    """A batch of B sequences sampled from the replay buffer (--algo r2d2), on the learner's device, time-major.
    The window's W rows: obs key -> [W, B, *shape] in the stored dtype, episode_start [W, B] bool (the state is
    zeroed before those rows), initial_state [B, H] (the state row 0 was acted from); its first `burn_in` rows
    only warm up the state. The L steps trained, from row burn_in on: actions [L, B] int64, returns [L, B] (the
    n-step discounted rewards), steps [L, B] int64 (n: the next observation is window row burn_in + i + n),
    discounts [L, B] (gamma ** n, 0 after a terminated step), trainable [L, B] bool; weights [B] (importance weights
    of prioritized replay, else 1)."""

    obs: dict
    episode_start: Tensor
    initial_state: Tensor
    actions: Tensor
    returns: Tensor
    steps: Tensor
    discounts: Tensor
    trainable: Tensor
    weights: Tensor
    burn_in: int
