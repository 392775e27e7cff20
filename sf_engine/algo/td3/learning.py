"""TD3 (--algo td3; Fujimoto, van Hoof and Meger 2018) on the replay buffer: a deterministic actor (the published,
acting model), twin critics trained on the smaller of their targets' values at a smoothed target action (the target
actor's, plus clipped Gaussian noise: --target_noise, --target_noise_clip), the actor and the targets updated every
--policy_delay critic updates (the actor on Q1 at its own action; the targets by Polyak steps of --target_tau).
Runs in the learner process; its replay source (sf_engine.roles.replay_source) samples the minibatches, and `train`
takes one step on one; with --normalize_input it hands `observe` each slot's observations as it inserts them.
"""

from __future__ import annotations

import copy

import torch

from sf_engine.algo.base import CompiledLosses, TrainingHooks, TrainResult, all_finite, schedule_learning_rate
from sf_engine.algo.batch import ReplayBatch
from sf_engine.algo.td3.networks import TD3Actor
from sf_engine.algo.training_state import Holds, TrainingState
from sf_engine.model.flat_state import FlatAdam, flatten_state
from sf_engine.model.sac_networks import TwinCritic

LOSS_STATS = ("critic_loss", "actor_loss", "q_mean", "td_abs_mean")  # then grad_norm


class TD3(TrainingState):
    """One policy's TD3 (sf_engine.algo.base.Algorithm, trained by `update` on replayed transitions). Its training
    state: the actor and its target, the critics and their targets, both optimizers (one learning rate) and the
    count of updates (the policy delay's phase); a state of optimizer states only loads those."""

    holds = Holds(
        modules=("model", "actor_target", "critic", "target"),
        optimizers={"actor": "optimizer", "critic": "critic_optimizer"},
        optimizers_key="optimizers",
        counters=("num_updates",),
    )

    @staticmethod
    def acting_network(spec, cfg, bf16: bool = False):
        """The network TD3 publishes, as every acting site builds it."""
        return TD3Actor(spec, cfg, bf16)

    def __init__(self, cfg, spec, device, hooks: TrainingHooks):
        self.cfg, self.lcfg, self.tcfg, self.device, self.hooks = cfg, cfg.learner, cfg.td3, device, hooks
        self.model = TD3Actor(spec, cfg).to(device)
        self.params = flatten_state(self.model)
        self.actor_target = copy.deepcopy(self.model).requires_grad_(False)
        self.actor_target_params = flatten_state(self.actor_target)
        self.actor_target_params.copy_(self.params)
        self.critic = TwinCritic(spec, cfg.model).to(device)
        self.critic_params = flatten_state(self.critic)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.target_params = flatten_state(self.target)
        self.target_params.copy_(self.critic_params)
        lr, eps = self.lcfg.learning_rate, self.lcfg.adam_eps
        self.optimizer = FlatAdam(self.model, self.params, lr=lr, eps=eps)  # the actor's
        self.critic_optimizer = FlatAdam(self.critic, self.critic_params, lr=lr, eps=eps)
        self.num_updates = 0
        self.last_actor_loss = torch.zeros((), device=device)
        self.compile = CompiledLosses(cfg, device, hooks.beat)  # --compile
        self.critic_loss, self.actor_loss = map(self.compile.compiled, (self._critic_loss, self._actor_loss))

    @property
    def learning_rate(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def train(self, batch: ReplayBatch) -> TrainResult:
        """One step of the critics on `batch`, and every --policy_delay steps one of the actor and the targets:
        its TrainResult, with |TD error| [B] as the priorities (the mean of the two critics'). A step whose loss or
        gradient is not finite is skipped whole (TrainResult.skipped_updates 1, TD errors 0)."""
        if self.num_updates % 64 == 0:
            schedule_learning_rate(self.optimizer, self.cfg, self.lcfg, self.hooks)
            self._set_learning_rate(self.learning_rate)
        with self.compile.step():
            return self._update(batch)

    def _update(self, batch: ReplayBatch) -> TrainResult:
        actor = self.model
        x, next_x = actor.inputs(batch.obs), actor.inputs(batch.next_obs)
        self.critic_optimizer.zero_grad()
        critic_loss, q_mean, td_abs = self.critic_loss(
            x, actor.distribution.unscale(batch.actions), next_x, batch.returns, batch.discounts, batch.weights
        )
        critic_loss.backward()
        norms = [self.critic_optimizer.clip_grad_norm(self.lcfg.max_grad_norm, critic_loss.detach())]

        delayed = self.num_updates % self.tcfg.policy_delay == 0  # the actor and the targets move this step
        if delayed:
            self.optimizer.zero_grad()
            self.critic.requires_grad_(False)  # the actor's loss goes through the critic, its weights held
            actor_loss = self.actor_loss(x)
            actor_loss.backward()
            self.critic.requires_grad_(True)
            norms.append(self.optimizer.clip_grad_norm(self.lcfg.max_grad_norm, actor_loss.detach()))
            self.last_actor_loss = actor_loss.detach().clone()  # kept for the updates between (a compiled one's is not)

        td_abs = td_abs.clone()  # the priorities outlive this update (a compiled one's outputs do not)
        stats = torch.stack([critic_loss.detach(), self.last_actor_loss, q_mean, td_abs.mean()])
        figures = torch.cat([stats, torch.linalg.vector_norm(torch.stack(norms)).reshape(1)]).cpu()
        if not all_finite(figures):
            return TrainResult(0, {}, 0, 1, torch.zeros_like(td_abs))
        self.critic_optimizer.step()
        if delayed:
            self.optimizer.step()
            for target, online in ((self.target_params, self.critic_params), (self.actor_target_params, self.params)):
                if all_finite(online):
                    target.lerp_(online, self.cfg.q.target_tau)
        self.num_updates += 1
        losses = dict(zip(LOSS_STATS + ("grad_norm",), figures.tolist()))
        return TrainResult(len(td_abs), losses, 1, 0, td_abs)

    def _critic_loss(self, x, actions, next_x, returns, discounts, weights) -> tuple:
        """The critics' loss, Q1's mean and |TD error| [B] (TwinCritic.loss) on the smoothed targets (_targets)."""
        return self.critic.loss(x, actions, self._targets(next_x, returns, discounts), weights)

    def _actor_loss(self, x) -> torch.Tensor:
        """The actor's loss: maximize Q1 at its own action, through the critic."""
        return -self.critic(x, self.model.squashed(x))[0].mean()

    @torch.no_grad()
    def _targets(self, next_x: torch.Tensor, returns: torch.Tensor, discounts: torch.Tensor) -> torch.Tensor:
        """[B] the n-step targets: `returns` + `discounts` x the smaller target critic's value at the target actor's
        action plus clipped Gaussian noise (target policy smoothing)."""
        action = self.actor_target.squashed(next_x)
        noise = (torch.randn_like(action) * self.tcfg.target_noise).clamp(
            -self.tcfg.target_noise_clip, self.tcfg.target_noise_clip
        )
        next_q = torch.minimum(*self.target(next_x, (action + noise).clamp(-1.0, 1.0)))
        return returns + discounts * next_q

    def observe(self, obs: dict) -> None:
        """The observations of the env steps just inserted into the replay buffer (key -> [N, *shape] NumPy): with
        --normalize_input the actor's running statistics merge them (the target actor follows with the weights)."""
        self.model.update_normalizer(obs)
