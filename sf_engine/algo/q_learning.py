"""The value-based family's common part (--algo dqn and --algo pqn): the Q-network, its flat parameters and
Adam, the learning rate (and its schedule), one optimizer step with the non-finite guard; the seam's state, load
and PBT methods derive from what it holds (sf_engine.algo.training_state). Runs in the learner process."""

from __future__ import annotations

import torch

from sf_engine.algo.base import TrainingHooks, all_finite, schedule_learning_rate
from sf_engine.algo.training_state import Holds, TrainingState
from sf_engine.model.flat_state import FlatAdam, flatten_state
from sf_engine.model.q_network import QNetwork


def follow_online(target: torch.Tensor, online: torch.Tensor, num_updates: int, qcfg) -> None:
    """A target network's flat weights after update `num_updates` of the online ones: every
    --target_update_period updates a copy, or a Polyak step of --target_tau; never toward a non-finite weight."""
    if num_updates % qcfg.target_update_period == 0 and all_finite(online):
        target.lerp_(online, qcfg.target_tau)


class QLearning(TrainingState):
    """A Q-network and its optimizer (its training state), built from the resolved Config `cfg`, the EnvSpec, the
    learner's device and the hooks of the process that hosts it."""

    holds = Holds(modules=("model",), optimizers={"optimizer": "optimizer"})

    @staticmethod
    def acting_network(spec, cfg, bf16: bool = False) -> QNetwork:
        """The network the value-based algorithms publish, as every acting site builds it."""
        return QNetwork(spec, cfg.model, cfg.q, bf16)

    def __init__(self, cfg, spec, device, hooks: TrainingHooks):
        self.cfg, self.lcfg, self.device, self.hooks = cfg, cfg.learner, device, hooks
        self.model = QNetwork(spec, cfg.model, cfg.q, cfg.run.bf16).to(device)
        self.params = flatten_state(self.model)
        self.optimizer = FlatAdam(self.model, self.params, lr=self.lcfg.learning_rate, eps=self.lcfg.adam_eps)

    @property
    def learning_rate(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def scheduled_learning_rate(self) -> None:
        schedule_learning_rate(self.optimizer, self.cfg, self.lcfg, self.hooks)

    def optimizer_step(self, gradients) -> torch.Tensor | None:
        """gradients() puts a minibatch's loss gradients into the optimizer's gradient and returns the loss
        stats [K]; then gradient clipping (--max_grad_norm), and the step when the stats and the gradient norm
        are finite. Returns the [K + 1] stats and the norm on the CPU, or None (step skipped)."""
        self.optimizer.zero_grad()
        stats = gradients()
        grad_norm = self.optimizer.clip_grad_norm(self.lcfg.max_grad_norm, stats.detach())
        figures = torch.cat([stats.detach(), grad_norm.detach().reshape(1)]).cpu()
        if not all_finite(figures):
            return None
        self.optimizer.step()
        return figures
