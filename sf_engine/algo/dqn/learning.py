"""The DQN family (--algo dqn) on the replay buffer: double Q-learning (van Hasselt et al. 2016), dueling heads
(--dueling), n-step returns and prioritized replay (the buffer's: Ape-X's recipe), a target network copied
every --target_update_period updates or moved by Polyak steps (--target_tau), the Huber loss (--huber_delta)
weighted by prioritized replay's importance weights, gradient clipping. Runs in the learner process; the
learner's replay source (sf_engine.roles.replay_source) samples the minibatches, and `train` takes one optimizer
step on one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sf_engine.algo.base import TrainResult
from sf_engine.algo.batch import ReplayBatch
from sf_engine.algo.q_learning import QLearning, follow_online
from sf_engine.algo.training_state import Holds
from sf_engine.algo.value_targets import double_q_targets
from sf_engine.envs.spec import ACTION_MASK_KEY
from sf_engine.model.flat_state import flatten_state
from sf_engine.model.q_network import QNetwork

LOSS_STATS = ("q_loss", "q_mean", "td_abs_mean")  # then grad_norm


class DQN(QLearning):
    """One policy's DQN (sf_engine.algo.base.Algorithm with `replay`: the learner trains it by `update`). Its
    training state adds the target network, which restarts from the online weights where a state has none and
    when those were replaced from outside, and the count of updates (the target period's phase)."""

    holds = Holds(
        modules=("model", "target"),
        optimizers={"optimizer": "optimizer"},
        counters=("num_updates",),
        follows={"target": "model"},
    )

    def __init__(self, cfg, spec, device, hooks):
        super().__init__(cfg, spec, device, hooks)
        self.qcfg = cfg.q
        self.target = QNetwork(spec, cfg.model, cfg.q, cfg.run.bf16).to(device)
        self.target.requires_grad_(False)
        self.target_params = flatten_state(self.target)
        self.target_params.copy_(self.params)
        self.num_updates = 0

    def train(self, batch: ReplayBatch) -> TrainResult:
        """One optimizer step on `batch`: its TrainResult, with |TD error| [B] as the priorities. A step whose
        loss or gradient is not finite is skipped (TrainResult.skipped_updates 1, TD errors 0)."""
        if self.num_updates % 64 == 0:
            self.scheduled_learning_rate()
        targets = self._targets(batch)
        td_abs = torch.empty_like(targets)
        delta = self.qcfg.huber_delta
        columns = batch.actions.reshape(-1, 1)

        def loss_and_grad(q_all):  # Huber loss weighted by the importance weights, and its gradient
            q = q_all.detach().gather(1, columns).squeeze(1)
            error = q - targets
            torch.abs(error, out=td_abs)
            clipped = td_abs.clamp(max=delta)  # the Huber loss is clipped * (|error| - clipped / 2)
            huber = clipped * (td_abs - 0.5 * clipped)
            grad = torch.zeros_like(q_all).scatter_(
                1, columns, (batch.weights * error.clamp(-delta, delta) / len(q)).unsqueeze(1)
            )
            sums = torch.stack([(batch.weights * huber).sum(), q.sum(), td_abs.sum()])  # sums, not means: cheaper
            return sums.div_(len(q)), grad

        def gradients():
            if self.model.direct_gradients(batch.obs):
                return self.model.q_loss_gradients(batch.obs, loss_and_grad)
            q = self.model.q_values(batch.obs).gather(1, columns).squeeze(1)
            td_abs.copy_((q - targets).detach().abs())
            loss = (batch.weights * F.huber_loss(q, targets, reduction="none", delta=delta)).mean()
            loss.backward()
            return torch.stack([loss.detach(), q.detach().mean(), td_abs.mean()])

        figures = self.optimizer_step(gradients)
        if figures is None:
            return TrainResult(0, {}, 0, 1, priorities=torch.zeros_like(td_abs))
        return self.step_taken(figures, len(td_abs), td_abs)

    def step_taken(self, figures: torch.Tensor, samples: int, priorities: torch.Tensor) -> TrainResult:
        """After an optimizer step on `samples` samples: the update counted, the target network following the
        online one, the TrainResult of its loss statistics `figures` (LOSS_STATS, then grad_norm) and `priorities`."""
        self.num_updates += 1
        follow_online(self.target_params, self.params, self.num_updates, self.qcfg)
        return TrainResult(samples, dict(zip(LOSS_STATS + ("grad_norm",), figures.tolist())), 1, 0, priorities)

    @torch.no_grad()
    def _targets(self, batch: ReplayBatch) -> torch.Tensor:
        """[B] n-step (double) Q-learning targets from the target network (and the online one's argmax)."""
        next_target = self.target.q_values(batch.next_obs)
        next_online = self.model.q_values(batch.next_obs) if self.qcfg.double_q else None
        legal = batch.next_obs[ACTION_MASK_KEY] != 0 if self.model.masked else None
        return double_q_targets(batch.returns, batch.discounts, next_online, next_target, legal, self.qcfg.double_q)
