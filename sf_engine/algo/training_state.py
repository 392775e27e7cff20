"""An algorithm's training state, named once: the modules, optimizers, plain tensors and counters it holds, from
which the seam's `state`, `load`, `copy_from`, `weights_replaced`, `hyperparameters` and `set_hyperparameters`
derive (sf_engine.algo.base.Algorithm). Runs in the learner process: its checkpoints and the training state it keeps
for a restarted learner (sf_engine.roles.learner: `state()` and `load()`), PBT's rounds (sf_engine.roles.population:
`copy_from`, the hyperparameters).

An algorithm class mixes in `TrainingState` and declares what it holds, by attribute name, in `holds`:

    class TD3(TrainingState):
        holds = Holds(
            modules=("model", "actor_target", "critic", "target"),
            optimizers={"actor": "optimizer", "critic": "critic_optimizer"},
            optimizers_key="optimizers",
            counters=("num_updates",),
        )

and its state is {"model": model.state_dict(), "actor_target": ..., "critic": ..., "target": ..., "optimizers":
{"actor": optimizer.state_dict(), "critic": critic_optimizer.state_dict()}, "num_updates": 3}.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from sf_engine.algo import pbt
from sf_engine.algo.base import set_learning_rate
from sf_engine.model.features import RunningMeanStd


@dataclass(frozen=True)
class Holds:
    """What an algorithm's training state is, each part named by the owner's attribute (a module's, a tensor's and a
    counter's name is also its key in the state):

    - `modules`: nn.Modules, by their state_dict. Their parameters and floating buffers are views into flat vectors
      (sf_engine.model.flat_state.flatten_state): loading copies into them in place. The first holds the published
      weights (`params`).
    - `optimizers`: state key -> attribute of a FlatAdam (its moments; its settings stay this run's: its
      load_state_dict keeps them), at the top of the state or under `optimizers_key`.
    - `tensors`: plain tensors (SAC's log_alpha, a view into an optimizer's flat vector), copied in place.
    - `counters`: integer attributes (num_updates); 0 when a state has none. PBT's exploit leaves them as they are.
    - `follows`: module -> the module it follows (DQN's target network, the online one): it restarts from that one's
      weights where a state has none of its own, and when the weights were replaced from outside.
    - `hyperparameters`: whether the state holds the hyperparameters in force, which a PBT member (--pbt) takes back
      when it loads them (PPO's).
    """

    modules: tuple[str, ...]
    optimizers: dict[str, str]
    optimizers_key: str | None = None
    tensors: tuple[str, ...] = ()
    counters: tuple[str, ...] = ()
    follows: dict[str, str] = field(default_factory=dict)
    hyperparameters: bool = False

    def __post_init__(self):
        if not self.modules or not self.optimizers:
            raise ValueError("Holds: an algorithm holds at least one module and one optimizer")
        strays = (set(self.follows) | set(self.follows.values())) - set(self.modules)
        if strays:
            raise ValueError(f"Holds: follows names {sorted(strays)}, which are not among the modules")


class TrainingState:
    """The seam's state methods of an algorithm whose class declares `holds` (Holds), run in the learner process.
    The algorithm has `cfg` (the resolved Config: a PBT member's own) and `lcfg` (its learner group)."""

    holds: ClassVar[Holds]

    def join_ranks(self, group) -> None:
        """Several learner ranks of this policy (--num_learners; sf_engine.runtime.ranks.RankGroup `group`): every
        optimizer averages its gradient over the ranks before a step, and every normalizer of the modules merges the
        statistics of every rank's batch, so that the ranks' states stay the same."""
        for name in self.holds.optimizers.values():
            getattr(self, name).average = group.average_
        for name in self.holds.modules:
            for module in getattr(self, name).modules():
                if isinstance(module, RunningMeanStd):
                    module.gather = group.gather

    def state(self) -> dict:
        """Tensors and plain data to checkpoint: every module's state_dict (views of the live weights, as a
        checkpoint is written at once), a copy of every tensor, every optimizer's state_dict, the counters (and the
        hyperparameters in force, where `holds.hyperparameters`)."""
        holds = self.holds
        state = {name: getattr(self, name).state_dict() for name in holds.modules}
        state |= {name: getattr(self, name).detach().clone() for name in holds.tensors}
        optimizers = {key: getattr(self, name).state_dict() for key, name in holds.optimizers.items()}
        state |= {holds.optimizers_key: optimizers} if holds.optimizers_key else optimizers
        state |= {name: getattr(self, name) for name in holds.counters}
        if holds.hyperparameters:
            state["hyperparameters"] = self.hyperparameters()
        return state

    def load(self, state: dict, source: str) -> None:
        """A checkpoint's state of this policy (`source`: where it came from). The weights are copied into the flat
        vectors in place; the optimizers take the moments and step counts, their settings stay this run's learning
        rates and --adam_eps (FlatAdam.load_state_dict). A module missing is an error, but for one that follows
        another (it restarts from that one's weights); a state with none of the modules holds optimizer states
        only, and the weights, tensors and counters stay as they are. Under --pbt a member takes back its own
        hyperparameters where the state holds them."""
        holds = self.holds
        if any(name in state for name in holds.modules):
            for name in holds.modules:
                if name in state or name not in holds.follows:
                    getattr(self, name).load_state_dict(state[name])
            self._follow([name for name in holds.follows if name not in state])
            with torch.no_grad():
                for name in holds.tensors:
                    getattr(self, name).copy_(state[name])
            for name in holds.counters:
                setattr(self, name, int(state.get(name, 0)))
        optimizers = state[holds.optimizers_key] if holds.optimizers_key else state
        for key, name in holds.optimizers.items():
            getattr(self, name).load_state_dict(optimizers[key])
        if holds.hyperparameters and self.cfg.policies.pbt and "hyperparameters" in state:
            self.set_hyperparameters(state["hyperparameters"])

    def copy_from(self, other: TrainingState) -> None:
        """PBT's exploit: `other`'s weights (every module's, normalizer statistics included), tensors and optimizer
        states, copied (the two members share no tensor); this member's learning rates, hyperparameters and
        counters stay its own."""
        holds = self.holds
        for name in holds.modules:
            _copy_weights(getattr(self, name), getattr(other, name))
        with torch.no_grad():
            for name in holds.tensors:
                getattr(self, name).copy_(getattr(other, name))
        for name in holds.optimizers.values():
            getattr(self, name).load_state_dict(copy.deepcopy(getattr(other, name).state_dict()))

    def weights_replaced(self) -> None:
        """`params` were overwritten from outside (a restarted learner's last published weights): each module that
        follows another (DQN's target network) restarts from the weights now in force; the others (SAC's and TD3's
        critics and targets: the learner's own, from its checkpoint) stay."""
        self._follow(list(self.holds.follows))

    def hyperparameters(self) -> dict:
        """The hyperparameters PBT explores (the spec's `pbt`: fields of the learner group or of the algorithm's own),
        as in force."""
        return pbt.hyperparameters(self.cfg)

    def set_hyperparameters(self, hyper: dict) -> None:
        """PBT's explore: this member's own hyperparameters from now on (its `cfg`, and `lcfg` its learner group),
        its learning rate in its optimizers."""
        self.cfg = pbt.with_hyperparameters(self.cfg, hyper)
        self.lcfg = self.cfg.learner
        self._set_learning_rate(self.lcfg.learning_rate)

    def _set_learning_rate(self, lr: float) -> None:
        """`lr` in every optimizer held (SAC overrides it: its critics' rate is in proportion)."""
        for name in self.holds.optimizers.values():
            set_learning_rate(getattr(self, name), lr)

    def _follow(self, names: list) -> None:
        for name in names:
            _copy_weights(getattr(self, name), getattr(self, self.holds.follows[name]))


def _copy_weights(module: torch.nn.Module, source: torch.nn.Module) -> None:
    """Every parameter and buffer of `source` into those of `module` (the same network), in place: the whole state
    its flat vector holds, a user's non-persistent buffers too (which a state_dict leaves out)."""
    theirs = dict(source.named_parameters()) | dict(source.named_buffers())
    with torch.no_grad():
        for name, tensor in itertools.chain(module.named_parameters(), module.named_buffers()):
            tensor.copy_(theirs[name])
