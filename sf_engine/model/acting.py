"""The acting contract: what every site that acts (the policy worker, the device sampler, the evaluator, enjoy.py,
load_policy, auto sizing's probe) asks of an algorithm's acting network, whichever algorithm published it. One call,
`act(obs, state, ctx) -> ActOutput`: the network decides how it acts, its exploration included (Ape-X's epsilons per
row, uniform actions before learning, Gaussian noise, sampling from its distribution); the site only says what it
knows (ActContext). Runs in every process that acts.

Shapes: obs key -> [B, *shape] tensors in their stored dtype on the network's device; state [B, state_size] (None
without a core), already zeroed where an episode starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch


@dataclass(frozen=True)
class ActContext:
    """What an acting site knows when it asks for actions.

    - `greedy`: the most likely actions, no exploration (evaluation; enjoy.py and load_policy by default).
    - `training`: acting for the learner's data, where the algorithm's exploration applies; False when playing
      (enjoy.py, load_policy, matches), where only the network's own sampling does (PPO's distribution, TD3's noise).
    - `env_steps`: the run's env steps so far (exploration schedules: DQN's epsilon).
    - `version`: the version of the weights in force (0: the learner has published no update yet).
    - `rows`: [B] int64 (a NumPy array, or a tensor on the network's device), each row's index among the run's
      `num_rows` acting env rows (Ape-X: a row's own epsilon); None where the site has no such rows (every row then
      acts alike).
    """

    greedy: bool = False
    training: bool = False
    env_steps: int = 0
    version: int = 0
    rows: np.ndarray | torch.Tensor | None = None
    num_rows: int = 1


PLAYING = ActContext()  # acting outside training: the network's own sampling
GREEDY = ActContext(greedy=True)


class ActOutput(NamedTuple):
    """What one act returns, per row: the actions [B, ...], their log-probabilities under the acting policy [B]
    (zeros where it has none: greedy), the values [B] in returns (zeros for an actor without a critic), and the new
    state [B, state_size] (None without a core)."""

    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    state: torch.Tensor | None


@runtime_checkable
class ActingNetwork(Protocol):
    """An algorithm's acting network (the `nn.Module` its class's `acting_network(env_spec, cfg, bf16)` builds,
    whose whole state the learner publishes as one flat vector): `recurrent` and `state_size` (0 without a core),
    `initial_state(batch, device)` (zeros [batch, state_size], None without a core), `outputs(obs, state)` (the part
    --compile captures, the forward that `act` runs), `refresh_bf16_acting()` (--bf16: after the weights change) and
    `act`."""

    recurrent: bool
    state_size: int

    def initial_state(self, batch: int, device="cpu"): ...

    def outputs(self, obs: dict, state=None): ...

    def refresh_bf16_acting(self) -> None: ...

    def act(self, obs: dict, state, ctx: ActContext, forward=None) -> ActOutput:
        """The rows' actions as `ctx` asks; `forward`: what runs `outputs` (--compile's graphed.BucketedForward),
        None: outputs itself."""


CONTRACT = ("recurrent", "state_size", "initial_state", "outputs", "refresh_bf16_acting", "act")


def contract_breaches(network) -> list:
    """The names of ActingNetwork's contract that `network` lacks (an empty list: it keeps the contract)."""
    return [name for name in CONTRACT if not hasattr(network, name)]
