"""PPO, the first learning algorithm behind the learner's seam (sf_engine.algo.base): one policy's model,
optimizer and hyperparameters; its advantage targets (GAE, or V-trace with --with_vtrace) and clipped PPO
epochs over the samples of a batch it may train on.

Runs in the learner process on the run's device. A feed-forward policy trains on minibatches of single
samples; a recurrent one on minibatches of whole --recurrence-long sequences, its core re-run from the
state stored where each starts. CartPole's separate MLPs on the CPU train without autograd (the compiled
forward, fused loss and backward: ActorCritic.loss_gradients).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import torch

from sf_engine.algo import base
from sf_engine.algo.base import TrainingHooks, TrainResult, all_finite, schedule_learning_rate
from sf_engine.algo.batch import TrajectoryBatch
from sf_engine.algo.ppo.loss import (
    DiscretePPOLoss,
    LossCoefficients,
    discrete_loss_and_grads,
    normalize,
    ppo_losses,
    sequence_index,
)
from sf_engine.algo.targets import gae, vtrace
from sf_engine.algo.training_state import Holds, TrainingState
from sf_engine.model.actor_critic import ActorCritic, PolicyValueModel, UserActorCritic
from sf_engine.model.flat_state import FlatAdam, flatten_state

LOSS_STATS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm")


@dataclass
class Samples:
    """The kept samples of a batch, flat [B, ...] (a feed-forward policy's minibatches pick rows): `obs`
    key -> [B, *shape] (images as [H, W, C] rows), behaviour log-probs, advantage targets and returns;
    `acting` [B] in turn-based games (float 0/1)."""

    obs: dict
    actions: torch.Tensor
    log_probs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    acting: torch.Tensor | None = None


@dataclass
class Sequences(Samples):
    """A batch cut into whole --recurrence-long sequences: every field [R, M, ...] (M sequences, see
    sequence_index), with `keep` [R, M] (the samples trained on), `starts` [R, M] (episode starts) and
    `states` [M, H] (the stored state each sequence starts from)."""

    keep: torch.Tensor | None = None
    starts: torch.Tensor | None = None
    states: torch.Tensor | None = None

    def columns(self, picked: torch.Tensor) -> Sequences:
        """Only the sequences `picked` (indices of M)."""
        pick = lambda x: x.index_select(1, picked)  # noqa: E731  [R, M, ...] -> [R, M', ...]
        out = {
            "obs": {key: pick(value) for key, value in self.obs.items()},
            "states": self.states.index_select(0, picked),
        }  # [M, H]: the sequences are its rows
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name not in out:
                out[f.name] = None if value is None else pick(value)
        return Sequences(**out)


class Minibatch(NamedTuple):
    """What the loss of one minibatch compares, over its kept samples [B]: the model's distribution
    parameters and values, the actions taken, their behaviour log-probs, the advantage targets and
    returns, and in turn-based games whether each sample's agent was to move."""

    params: torch.Tensor
    values: torch.Tensor
    actions: torch.Tensor
    old_log_probs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    acting: torch.Tensor | None = None


class PPO(TrainingState):
    """One policy's PPO (sf_engine.algo.base.Algorithm): built from the resolved Config `cfg`, the env's
    EnvSpec, the learner's torch device and the hooks of the process that hosts it. Its training state: the
    model (normalizer statistics included), the optimizer and the hyperparameters in force (a PBT member's own)."""

    holds = Holds(modules=("model",), optimizers={"optimizer": "optimizer"}, hyperparameters=True)

    @staticmethod
    def acting_network(spec, cfg, bf16: bool = False) -> PolicyValueModel:
        """The network PPO publishes, as every acting site builds it: the actor-critic, or a user's (--model)."""
        return (UserActorCritic if cfg.model.model else ActorCritic)(spec, cfg.model, bf16)

    def __init__(self, cfg, spec, device, hooks: TrainingHooks):
        self.cfg, self.lcfg, self.device, self.hooks = cfg, cfg.learner, device, hooks
        self.model = self.acting_network(spec, cfg, cfg.run.bf16).to(device)
        encoder = self.model.input_encoder  # [C, H, W] images: kept as [H, W, C] rows for the minibatches,
        self.chw_images = encoder.image_keys - encoder.hwc_keys  # reordered once per batch, not per minibatch
        self.params = flatten_state(self.model)
        # --compile: the feed-forward minibatches' forward through torch.compile (the same parameters; a
        # second minibatch size makes the batch dimension dynamic, not one graph per size)
        self.forward = torch.compile(self.model) if cfg.run.compile else self.model
        self.optimizer = FlatAdam(self.model, self.params, lr=self.lcfg.learning_rate, eps=self.lcfg.adam_eps)
        self.coefficients = self._coefficients()

    # --- the seam (sf_engine.algo.base.Algorithm) ---------------------------------------------------
    @property
    def learning_rate(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def set_hyperparameters(self, hyper: dict) -> None:
        """This member's own learning rate, entropy coefficient, gamma and clip ratio (PBT)."""
        super().set_hyperparameters(hyper)
        self.coefficients = self._coefficients()

    def train(self, batch: TrajectoryBatch) -> TrainResult:
        """Targets of the whole batch, then PPO epochs over its samples that `batch.keep` [T, N] marks (this
        policy's, valid and within the lag bound)."""
        keep = batch.keep
        advantages, returns = self._targets(batch)
        index = keep.reshape(-1).nonzero().squeeze(1)
        flat = lambda x: x.reshape(-1, *x.shape[2:]).index_select(0, index)  # noqa: E731  [T, N, ...] -> kept
        samples = Samples(
            obs={
                key: flat(value[:-1].permute(0, 1, 3, 4, 2) if key in self.chw_images else value[:-1])
                for key, value in batch.obs.items()
            },
            actions=flat(batch.actions),
            log_probs=flat(batch.log_probs),
            advantages=flat(advantages),
            returns=flat(returns),
            acting=None if batch.acting is None else flat(batch.acting).float(),
        )
        if not index.numel() and self.optimizer.average is None:
            return TrainResult(0)
        if not index.numel():  # several ranks: this one's share holds no sample, and it still takes every step
            result = self._optimize(0, lambda picked: None)
        elif self.model.recurrent:
            result = self._ppo_epochs_recurrent(self._own_sequences(self._sequences(batch, keep, advantages, returns)))
        else:
            result = self._ppo_epochs(samples)
        # after the epochs: the behaviour log-probs were computed with the statistics in force (not after a
        # skipped update: a non-finite value in the batch would poison them)
        if not result.skipped_updates:
            self.model.update_normalizers(samples.obs, samples.returns)
        return dataclasses.replace(result, samples=int(index.numel()))

    # --- targets ------------------------------------------------------------------------------------
    def _targets(self, batch: TrajectoryBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Advantages and value targets [T, N]. GAE uses the behaviour values and the learner's value of
        the bootstrap row (a recurrent core steps once from the state stored for it); V-trace
        re-evaluates the whole batch with the current weights (a core is re-run over the rollout)."""
        gamma, ppo, model = self.lcfg.gamma, self.cfg.ppo, self.model
        num_steps, num_traj = batch.rewards.shape
        flat_obs = {k: v.reshape(-1, *v.shape[2:]) for k, v in batch.obs.items()}
        last_obs = {k: v[-1] for k, v in batch.obs.items()}
        with torch.no_grad():
            if ppo.with_vtrace and model.recurrent:  # from the stored first state
                params, values, _ = model.forward_sequence(flat_obs, batch.rnn_states[0], batch.episode_start)
            elif ppo.with_vtrace:
                params, values = model(flat_obs)
            elif model.recurrent:  # GAE needs the learner's value of the bootstrap row only
                state = batch.rnn_states[-1] * (~batch.episode_start[-1]).unsqueeze(-1)
                _, values, _ = model(last_obs, state)
            else:
                values = model.values(last_obs)
            values = model.denormalize_values(values).reshape(-1, num_traj)  # [T+1, N], or [1, N]
            if not ppo.with_vtrace:
                values = torch.cat([batch.values, values[-1:]])
                return gae(batch.rewards, values, batch.terminated, batch.dones, batch.valid, gamma, ppo.gae_lambda)
            actions = batch.actions.reshape(num_steps * num_traj, *batch.actions.shape[2:])
            target_log_probs, _ = model.log_prob_entropy(params[: num_steps * num_traj], actions)
            target_log_probs = target_log_probs.reshape(num_steps, num_traj)
            if batch.acting is not None:  # a waiting agent's action changed nothing: no correction there
                target_log_probs = torch.where(batch.acting, target_log_probs, batch.log_probs)
            vs, advantages = vtrace(
                batch.log_probs,
                target_log_probs,
                batch.rewards,
                values,
                batch.terminated,
                batch.dones,
                batch.valid,
                gamma,
                ppo.vtrace_rho_bar,
                ppo.vtrace_c_bar,
            )
            return advantages, vs

    def _sequences(self, batch: TrajectoryBatch, keep, advantages, returns) -> Sequences:
        """The batch cut into whole --recurrence-long sequences (see sequence_index), with the stored
        state each sequence starts from."""
        num_steps, num_traj = keep.shape
        index = sequence_index(num_steps, num_traj, self.lcfg.recurrence).to(self.device)
        cut = lambda x: x.reshape(num_steps * num_traj, *x.shape[2:])[index]  # noqa: E731
        return Sequences(
            obs={key: cut(value[:-1]) for key, value in batch.obs.items()},
            actions=cut(batch.actions),
            log_probs=cut(batch.log_probs),
            advantages=cut(advantages),
            returns=cut(returns),
            acting=None if batch.acting is None else cut(batch.acting).float(),
            keep=cut(keep),
            starts=cut(batch.episode_start[:-1]),
            states=batch.rnn_states[:-1].reshape(num_steps * num_traj, -1)[index[0]],
        )

    def _own_sequences(self, seq: Sequences) -> Sequences:
        """With several policies: only the sequences holding a sample this policy keeps (the others'
        are not re-run, and its minibatches count its own)."""
        if self.cfg.policies.num_policies == 1:
            return seq
        return seq.columns(seq.keep.any(0).nonzero().squeeze(1))

    # --- epochs -------------------------------------------------------------------------------------
    def _coefficients(self) -> LossCoefficients:
        ppo = self.cfg.ppo
        return LossCoefficients(ppo.ppo_clip_ratio, ppo.value_loss_coeff, ppo.entropy_coeff)

    def _ppo_epochs(self, samples: Samples) -> TrainResult:
        """Feed-forward: minibatches of kept samples (flat [B, ...])."""

        def minibatch(picked) -> Minibatch:
            take = lambda x: x.index_select(0, picked)  # noqa: E731  (a row copy: faster than x[picked])
            params, values = self.forward(
                {
                    key: take(obs).permute(0, 3, 1, 2) if key in self.chw_images else take(obs)
                    for key, obs in samples.obs.items()
                }
            )
            return Minibatch(
                params,
                values,
                take(samples.actions),
                take(samples.log_probs),
                take(samples.advantages),
                take(samples.returns),
                None if samples.acting is None else take(samples.acting),
            )

        if samples.acting is not None or not self.model.direct_gradients(samples.obs):
            return self._optimize(samples.log_probs.numel(), self._autograd_gradients(minibatch))
        coefficients = self.coefficients

        def direct(picked):  # CartPole's model on the CPU: compiled forward, loss and backward, no autograd
            if picked.numel() < 2:
                return None
            take = lambda x: x.index_select(0, picked)  # noqa: E731
            actions, old_log_probs = take(samples.actions), take(samples.log_probs)
            advantages = normalize(take(samples.advantages))
            returns = self.model.normalize_returns(take(samples.returns))
            self.optimizer.zero_grad()
            return self.model.loss_gradients(
                {key: take(obs) for key, obs in samples.obs.items()},
                lambda logits, values: discrete_loss_and_grads(
                    logits, values, actions, old_log_probs, advantages, returns, coefficients
                )[1:],
            )

        return self._optimize(samples.log_probs.numel(), direct)

    def _ppo_epochs_recurrent(self, seq: Sequences) -> TrainResult:
        """Recurrent: minibatches of whole sequences (`Sequences`); the core is re-run from where each
        starts and the losses cover kept samples."""
        recurrence = seq.keep.shape[0]

        def minibatch(picked) -> Minibatch:
            obs = {
                key: value[:, picked].reshape(recurrence * len(picked), *value.shape[2:])
                for key, value in seq.obs.items()
            }
            params, values, _ = self.model.forward_sequence(obs, seq.states[picked], seq.starts[:, picked])
            kept = seq.keep[:, picked].reshape(-1).nonzero().squeeze(1)
            pick = lambda x: x[:, picked].reshape(-1, *x.shape[2:])[kept]  # noqa: E731
            return Minibatch(
                params[kept],
                values[kept],
                pick(seq.actions),
                pick(seq.log_probs),
                pick(seq.advantages),
                pick(seq.returns),
                None if seq.acting is None else pick(seq.acting),
            )

        return self._optimize(seq.keep.shape[1], self._autograd_gradients(minibatch), unit=recurrence)

    def _autograd_gradients(self, minibatch):
        """gradients(indices) for _optimize, through autograd: minibatch(indices) is the Minibatch of
        those samples or sequences."""

        def gradients(picked):
            batch = minibatch(picked)
            if batch.values.numel() < 2:
                return None
            loss, stats = self._loss(batch)
            loss = self.model.plus_auxiliary_loss(loss)  # a user's network's own loss term (--model)
            self.optimizer.zero_grad()
            loss.backward()
            return stats

        return gradients

    def _minibatches(self, num_units: int, unit: int) -> int:
        """Minibatches per epoch: --num_batches_per_epoch; with several policies, as many as this policy's
        share of the batch fills at --batch_size samples each (`unit`: samples per unit), so that each
        policy steps about once per --batch_size samples, as one policy alone does."""
        lcfg = self.lcfg
        if self.cfg.policies.num_policies == 1:
            return lcfg.num_batches_per_epoch
        return max(1, min(lcfg.num_batches_per_epoch, round(num_units * unit / lcfg.batch_size)))

    def _optimize(self, num_units: int, gradients, unit: int = 1) -> TrainResult:
        """--num_epochs passes of minibatches (`_minibatches`) over `num_units` samples or sequences (of
        `unit` samples), each a clipped PPO step: gradients(indices) puts the minibatch's loss gradients
        into the optimizer's gradient and returns the loss stats [5] (None: too few samples, skipped). A
        step whose loss stats or gradient norm are not finite is not taken (counted: `skipped_updates`).
        With several learner ranks (the optimizer averages over them) every rank takes part in every minibatch's
        step, whatever its own share holds (none: a zero gradient), and a rank's non-finite loss makes the mean
        gradient non-finite: the ranks take the same steps."""
        lcfg = self.lcfg
        schedule_learning_rate(self.optimizer, self.cfg, self.lcfg, self.hooks)
        totals = torch.zeros(len(LOSS_STATS))
        num_updates = skipped = 0
        minibatches = self._minibatches(num_units, unit)
        ranked = self.optimizer.average is not None
        for _ in range(lcfg.num_epochs):
            for picked in torch.randperm(num_units, device=self.device).tensor_split(minibatches):
                if self.hooks.stopping() or (picked.numel() < 1 and not ranked):  # a stop does not wait for epochs
                    continue
                self.hooks.beat()
                # --compile: a new minibatch size compiles again, at any update: heartbeats meanwhile
                with base.keep_beating(self.hooks.beat) if self.cfg.run.compile else contextlib.nullcontext():
                    stats = gradients(picked) if picked.numel() else None
                if stats is None and not ranked:
                    continue
                if stats is None:
                    self.optimizer.zero_grad()
                    stats = torch.zeros(len(LOSS_STATS) - 1, device=self.device)
                grad_norm = self.optimizer.clip_grad_norm(lcfg.max_grad_norm, stats.detach())
                figures = torch.cat([stats.detach(), grad_norm.detach().reshape(1)]).cpu()
                if not all_finite(figures):  # a NaN or inf in the loss or any gradient
                    skipped += 1
                    continue
                self.optimizer.step()
                totals += figures
                num_updates += 1
        losses = {name: float(v) / num_updates for name, v in zip(LOSS_STATS, totals)} if num_updates else {}
        return TrainResult(0, losses, num_updates, skipped)

    def _loss(self, batch: Minibatch):
        """(the PPO loss of a minibatch, its stats [policy loss, value loss, entropy, approx KL, clip
        fraction]); categorical actions take the fused loss (DiscretePPOLoss). `batch.acting` (turn-based
        games): the samples whose agent was to move, the only ones the policy's terms cover."""
        model, coefficients = self.model, self.coefficients
        advantages, returns = normalize(batch.advantages, batch.acting), model.normalize_returns(batch.returns)
        if model.distribution.kind == "discrete" and batch.acting is None:
            return DiscretePPOLoss.apply(
                batch.params, batch.values, batch.actions, batch.old_log_probs, advantages, returns, coefficients
            )
        log_probs, entropy = model.log_prob_entropy(batch.params, batch.actions)
        losses = ppo_losses(
            log_probs,
            batch.old_log_probs,
            advantages,
            batch.values,
            returns,
            entropy,
            coefficients.clip_ratio,
            weight=batch.acting,
        )
        policy_loss, value_loss, entropy_mean = losses[:3]
        loss = policy_loss + coefficients.value_loss_coeff * value_loss - coefficients.entropy_coeff * entropy_mean
        return loss, torch.stack([x.detach() for x in losses])
