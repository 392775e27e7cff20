"""Soft actor-critic (--algo sac; Haarnoja et al. 2018, with the automatic temperature of their second paper) on the
replay buffer: a tanh-squashed Gaussian actor (the published, acting model), twin critics and their
Polyak-averaged targets (--target_tau every --target_update_period updates), the entropy temperature tuned
toward --target_entropy per action dimension (--tune_alpha) or fixed (--alpha). Each update: the critics on
the n-step soft targets (weighted by prioritized replay's importance weights), then the actor, then the
temperature, each with its own Adam (the actor's at --learning_rate, the others' at --critic_learning_rate).
Runs in the learner process; its replay source (sf_engine.roles.replay_source) samples the minibatches, and `train`
takes one step on one; with --normalize_input it hands `observe` each slot's observations as it inserts them.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from sf_engine.algo.base import (
    CompiledLosses,
    TrainingHooks,
    TrainResult,
    all_finite,
    schedule_learning_rate,
    set_learning_rate,
)
from sf_engine.algo.batch import ReplayBatch
from sf_engine.algo.q_learning import follow_online
from sf_engine.algo.training_state import Holds, TrainingState
from sf_engine.model.flat_state import FlatAdam, flatten_state
from sf_engine.model.sac_networks import SACActor, TwinCritic

LOSS_STATS = ("critic_loss", "actor_loss", "alpha", "entropy", "q_mean", "td_abs_mean")  # then grad_norm


class SAC(TrainingState):
    """One policy's SAC (sf_engine.algo.base.Algorithm with `replay`: the learner trains it by `update`). Its
    training state: the actor, the critics and their targets, the temperature, the three optimizers and the count
    of updates (the target period's phase); a state of optimizer states only loads those."""

    holds = Holds(
        modules=("model", "critic", "target"),
        tensors=("log_alpha",),
        optimizers={"actor": "optimizer", "critic": "critic_optimizer", "alpha": "alpha_optimizer"},
        optimizers_key="optimizers",
        counters=("num_updates",),
    )

    @staticmethod
    def acting_network(spec, cfg, bf16: bool = False) -> SACActor:
        """The network SAC publishes (its actor), as every acting site builds it."""
        return SACActor(spec, cfg.model, bf16, cfg.replay.random_before_learning)

    def __init__(self, cfg, spec, device, hooks: TrainingHooks):
        self.cfg, self.lcfg, self.scfg, self.qcfg, self.device, self.hooks = (
            cfg,
            cfg.learner,
            cfg.sac,
            cfg.q,
            device,
            hooks,
        )
        self.model = SACActor(spec, cfg.model).to(device)
        self.params = flatten_state(self.model)
        self.critic = TwinCritic(spec, cfg.model).to(device)
        self.critic_params = flatten_state(self.critic)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.target_params = flatten_state(self.target)
        self.target_params.copy_(self.critic_params)
        lr, eps = self.lcfg.learning_rate, self.lcfg.adam_eps
        self.optimizer = FlatAdam(self.model, self.params, lr=lr, eps=eps)  # the actor's
        self.critic_optimizer = FlatAdam(self.critic, self.critic_params, lr=lr, eps=eps)
        temperature = _Temperature(self.scfg.alpha).to(device)
        self.alpha_optimizer = FlatAdam(temperature, flatten_state(temperature), lr=lr, eps=eps)
        self.log_alpha = temperature.log_alpha  # a view into the optimizer's flat vector
        self.target_entropy = self.scfg.target_entropy * self.model.distribution.size
        self.num_updates = 0
        self._set_learning_rate(lr)
        self.compile = CompiledLosses(cfg, device, hooks.beat)  # --compile
        self.critic_loss, self.actor_loss = map(self.compile.compiled, (self._critic_loss, self._actor_loss))

    @property
    def learning_rate(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def _set_learning_rate(self, lr: float) -> None:
        """`lr` for the actor; the critics and the temperature take --critic_learning_rate in the same proportion
        to --learning_rate (the same rate when it is 0)."""
        critic_lr = self.scfg.critic_learning_rate
        set_learning_rate(self.optimizer, lr)
        for optimizer in (self.critic_optimizer, self.alpha_optimizer):
            set_learning_rate(optimizer, lr * critic_lr / self.lcfg.learning_rate if critic_lr > 0 else lr)

    def train(self, batch: ReplayBatch) -> TrainResult:
        """One step of the critics, the actor and the temperature on `batch`: its TrainResult, with |TD error| [B]
        as the priorities (the mean of the two critics'). A step whose loss or gradient is not finite is skipped
        whole (TrainResult.skipped_updates 1, TD errors 0)."""
        if self.num_updates % 64 == 0:
            schedule_learning_rate(self.optimizer, self.cfg, self.lcfg, self.hooks)
            self._set_learning_rate(self.learning_rate)
        with self.compile.step():
            return self._update(batch)

    def _update(self, batch: ReplayBatch) -> TrainResult:
        actor = self.model
        x, next_x = actor.inputs(batch.obs), actor.inputs(batch.next_obs)
        alpha = self.log_alpha.detach().exp()
        self.critic_optimizer.zero_grad()
        critic_loss, q_mean, td_abs = self.critic_loss(
            x, actor.distribution.unscale(batch.actions), next_x, batch.returns, batch.discounts, batch.weights, alpha
        )
        critic_loss.backward()
        critic_norm = self.critic_optimizer.clip_grad_norm(self.lcfg.max_grad_norm, critic_loss.detach())

        self.optimizer.zero_grad()
        self.critic.requires_grad_(False)  # the actor's loss goes through the critics, their weights held
        actor_loss, log_probs = self.actor_loss(x, alpha)
        actor_loss.backward()
        self.critic.requires_grad_(True)
        actor_norm = self.optimizer.clip_grad_norm(self.lcfg.max_grad_norm, actor_loss.detach())

        td_abs = td_abs.clone()  # the priorities outlive this update (a compiled one's outputs do not)
        stats = torch.stack(
            [critic_loss.detach(), actor_loss.detach(), alpha, -log_probs.mean(), q_mean, td_abs.mean()]
        )
        figures = torch.cat([stats, torch.linalg.vector_norm(torch.stack([critic_norm, actor_norm])).reshape(1)])
        figures = figures.cpu()
        if not all_finite(figures):
            return TrainResult(0, {}, 0, 1, torch.zeros_like(td_abs))
        self.critic_optimizer.step()
        self.optimizer.step()
        if self.scfg.tune_alpha:  # toward the target entropy: alpha grows while the entropy is below it
            self.alpha_optimizer.zero_grad()
            alpha_loss = -(self.log_alpha * (log_probs + self.target_entropy).mean())
            alpha_loss.backward()
            self.alpha_optimizer.step()
        self.num_updates += 1
        follow_online(self.target_params, self.critic_params, self.num_updates, self.qcfg)
        losses = dict(zip(LOSS_STATS + ("grad_norm",), figures.tolist()))
        return TrainResult(len(td_abs), losses, 1, 0, td_abs)

    def _critic_loss(self, x, actions, next_x, returns, discounts, weights, alpha) -> tuple:
        """The critics' loss, Q1's mean and |TD error| [B] (TwinCritic.loss) on the n-step soft targets: `returns` +
        `discounts` x (min of the target critics - alpha x log pi) at an action the actor samples for the next
        observation."""
        with torch.no_grad():
            next_actions, next_log_probs = self.model.distribution.rsample(self.model.params_of(next_x))
            next_q = torch.minimum(*self.target(next_x, next_actions)) - alpha * next_log_probs
            targets = returns + discounts * next_q
        return self.critic.loss(x, actions, targets, weights)

    def _actor_loss(self, x, alpha) -> tuple:
        """The actor's loss (maximize min(Q1, Q2) + the entropy bonus, through the critics) and its actions'
        log-probabilities [B]."""
        squashed, log_probs = self.model.distribution.rsample(self.model.params_of(x))
        return (alpha * log_probs - torch.minimum(*self.critic(x, squashed))).mean(), log_probs.detach()

    def observe(self, obs: dict) -> None:
        """The observations of the env steps just inserted into the replay buffer (key -> [N, *shape] NumPy, each
        trainable step once): with --normalize_input the actor's running statistics merge them, so that they
        follow the data as it arrives whatever the minibatches draw (prioritized replay's come in buffer order)."""
        self.model.update_normalizer(obs)


class _Temperature(nn.Module):
    """SAC's entropy temperature as log(alpha), one parameter (trained by its own FlatAdam)."""

    def __init__(self, alpha: float):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(math.log(alpha)))
