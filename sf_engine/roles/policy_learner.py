"""One policy's learning inside the learner process: its model, optimizer, version and shared weights;
its advantage targets and PPO epochs over the samples of a batch that it acted (sf_engine.roles.learner
gathers the batch and hands each policy its part; with --num_policies 1 there is one of these).
"""

from __future__ import annotations

import logging

import torch

from sf_engine.algo import ppo_math as ppo
from sf_engine.model.actor_critic import ActorCritic
from sf_engine.model.kernels import FlatAdam
from sf_engine.runtime.weights import flatten_state


class PolicyLearner:
    def __init__(self, ctx, policy: int, env_steps):
        """Policy `policy` of the run of `ctx` (a RoleContext); `env_steps()`: the run's env steps so far
        (the linear learning-rate schedule)."""
        plan = ctx.plan
        self.ctx, self.policy, self.cfg, self.lcfg, self.env_steps = ctx, policy, plan.cfg, plan.cfg.learner, env_steps
        self.device = torch.device(self.cfg.run.device)
        self.model = ActorCritic(plan.spec, self.cfg.model, self.cfg.run.bf16).to(self.device)
        encoder = self.model.actor_encoder  # [C, H, W] images: kept as [H, W, C] rows for the minibatches,
        self.chw_images = encoder.image_keys - encoder.hwc_keys  # reordered once per batch, not per minibatch
        self.params = flatten_state(self.model)
        self.optimizer = FlatAdam(self.model, self.params, lr=self.lcfg.learning_rate, eps=self.lcfg.adam_eps)
        self.version = 0
        self.min_version = 0  # samples acted by an older version are dropped (a PBT exploit replaced the weights)
        self.weights = ctx.weights(policy)

    def set_hyperparameters(self, hyper: dict) -> None:
        """This member's own learning rate, entropy coefficient, gamma and clip ratio (PBT)."""
        from sf_engine.roles.population import with_hyperparameters

        self.lcfg = with_hyperparameters(self.lcfg, hyper)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lcfg.learning_rate

    def copy_from(self, other: "PolicyLearner") -> None:
        """PBT's exploit: `other`'s weights (normalizer statistics included) and optimizer state."""
        import copy

        self.params.copy_(other.params)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.load_state_dict(copy.deepcopy(other.optimizer.state_dict()))
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def load(self, state: dict, source: str) -> None:
        """Weights, optimizer state and version from a checkpoint's state of this policy."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # this run's --learning_rate, not the saved one (PBT: the member's)
            group["lr"] = self.lcfg.learning_rate
        self.version = self.min_version = int(state["version"])
        if self.cfg.policies.pbt and "hyperparameters" in state:  # a PBT member's own, as the population left them
            self.set_hyperparameters(state["hyperparameters"])
        logging.info("policy %d resumed from %s (version %d)", self.policy, source, self.version)

    def state(self) -> dict:
        from sf_engine.roles.population import hyperparameters

        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "hyperparameters": hyperparameters(self.lcfg),
        }

    def train(self, batch: dict, keep) -> tuple:
        """Targets of the whole batch, then PPO epochs over its samples that `keep` [T, N] marks (this
        policy's, valid and within the lag bound). Returns (samples trained, loss stats)."""
        advantages, returns = self._targets(batch)
        index = keep.reshape(-1).nonzero().squeeze(1)
        flat = lambda x: x.reshape(-1, *x.shape[2:]).index_select(0, index)  # noqa: E731  [T, N, ...] -> kept
        samples = {
            "obs": {
                key: flat(value[:-1].permute(0, 1, 3, 4, 2) if key in self.chw_images else value[:-1])
                for key, value in batch["obs"].items()
            },
            "actions": flat(batch["actions"]),
            "log_probs": flat(batch["log_probs"]),
            "advantages": flat(advantages),
            "returns": flat(returns),
        }
        if "acting" in batch:
            samples["acting"] = flat(batch["acting"]).float()
        losses = {}
        if index.numel():
            losses = (
                self._ppo_epochs_recurrent(self._own_sequences(self._sequences(batch, keep, advantages, returns)))
                if self.model.recurrent
                else self._ppo_epochs(samples)
            )
            # after the epochs: the behaviour log-probs were computed with the statistics in force
            self.model.update_normalizers(samples["obs"], samples["returns"])
        return int(index.numel()), losses

    def _targets(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Advantages and value targets [T, N]. GAE uses the behaviour values and the learner's value of
        the bootstrap row (a recurrent core steps once from the state stored for it); V-trace
        re-evaluates the whole batch with the current weights (a core is re-run over the rollout)."""
        lcfg, model = self.lcfg, self.model
        num_steps, num_traj = batch["rewards"].shape
        dones = batch["terminated"] | batch["truncated"]
        flat_obs = {k: v.reshape(-1, *v.shape[2:]) for k, v in batch["obs"].items()}
        with torch.no_grad():
            if lcfg.with_vtrace and model.recurrent:  # from the stored first state
                params, values, _ = model.forward_sequence(flat_obs, batch["rnn_states"][0], batch["episode_start"])
            elif lcfg.with_vtrace:
                params, values = model(flat_obs)
            elif model.recurrent:  # GAE needs the learner's value of the bootstrap row only
                state = batch["rnn_states"][-1] * (~batch["episode_start"][-1]).unsqueeze(-1)
                _, values, _ = model({k: v[-1] for k, v in batch["obs"].items()}, state)
            else:
                values = model.values({k: v[-1] for k, v in batch["obs"].items()})
            values = model.denormalize_values(values).reshape(-1, num_traj)  # [T+1, N], or [1, N]
            if not lcfg.with_vtrace:
                values = torch.cat([batch["values"], values[-1:]])
                return ppo.gae(
                    batch["rewards"], values, batch["terminated"], dones, batch["valid"], lcfg.gamma, lcfg.gae_lambda
                )
            actions = batch["actions"].reshape(num_steps * num_traj, *batch["actions"].shape[2:])
            target_log_probs, _ = model.log_prob_entropy(params[: num_steps * num_traj], actions)
            target_log_probs = target_log_probs.reshape(num_steps, num_traj)
            if "acting" in batch:  # a waiting agent's action changed nothing: no correction there
                target_log_probs = torch.where(batch["acting"], target_log_probs, batch["log_probs"])
            vs, advantages = ppo.vtrace(
                batch["log_probs"],
                target_log_probs,
                batch["rewards"],
                values,
                batch["terminated"],
                dones,
                batch["valid"],
                lcfg.gamma,
                lcfg.vtrace_rho_bar,
                lcfg.vtrace_c_bar,
            )
            return advantages, vs

    def _sequences(self, batch: dict, keep, advantages, returns) -> dict:
        """The batch cut into whole --recurrence-long sequences: [R, M, ...] per field (see
        ppo.sequence_index), with the stored state each sequence starts from."""
        num_steps, num_traj = keep.shape
        index = ppo.sequence_index(num_steps, num_traj, self.lcfg.recurrence).to(self.device)
        cut = lambda x: x.reshape(num_steps * num_traj, *x.shape[2:])[index]  # noqa: E731
        return {
            "obs": {key: cut(value[:-1]) for key, value in batch["obs"].items()},
            "actions": cut(batch["actions"]),
            "log_probs": cut(batch["log_probs"]),
            "advantages": cut(advantages),
            "returns": cut(returns),
            "keep": cut(keep),
            "starts": cut(batch["episode_start"][:-1]),
            **({"acting": cut(batch["acting"]).float()} if "acting" in batch else {}),
            "states": batch["rnn_states"][:-1].reshape(num_steps * num_traj, -1)[index[0]],
        }

    def _own_sequences(self, seq: dict) -> dict:
        """With several policies: only the sequences holding a sample this policy keeps (the others'
        are not re-run, and its minibatches count its own)."""
        if self.cfg.policies.num_policies == 1:
            return seq
        columns = seq["keep"].any(0).nonzero().squeeze(1)
        pick = lambda x: x.index_select(1, columns)  # noqa: E731  [R, M, ...] -> its M'
        out = {
            key: ({k: pick(v) for k, v in value.items()} if isinstance(value, dict) else pick(value))
            for key, value in seq.items()
            if key != "states"
        }
        return out | {"states": seq["states"].index_select(0, columns)}

    def _set_learning_rate(self) -> None:
        if self.lcfg.lr_schedule == "linear":
            fraction_left = max(0.0, 1.0 - self.env_steps() / self.cfg.run.train_for_env_steps)
            for group in self.optimizer.param_groups:
                group["lr"] = self.lcfg.learning_rate * fraction_left

    def _ppo_epochs(self, samples: dict) -> dict:
        """Feed-forward: minibatches of kept samples (flat [B, ...])."""

        def minibatch_outputs(minibatch):
            take = lambda x: x.index_select(0, minibatch)  # noqa: E731  (a row copy: faster than x[minibatch])
            params, values = self.model(
                {
                    key: take(obs).permute(0, 3, 1, 2) if key in self.chw_images else take(obs)
                    for key, obs in samples["obs"].items()
                }
            )
            return (
                params,
                values,
                take(samples["actions"]),
                take(samples["log_probs"]),
                take(samples["advantages"]),
                take(samples["returns"]),
            ) + ((take(samples["acting"]),) if "acting" in samples else ())

        if "acting" in samples or not self.model.direct_gradients(samples["obs"]):
            return self._optimize(samples["log_probs"].numel(), self._autograd_gradients(minibatch_outputs))
        lcfg = self.lcfg

        def direct(minibatch):  # CartPole's model on the CPU: compiled forward, loss and backward, no autograd
            if minibatch.numel() < 2:
                return None
            take = lambda x: x.index_select(0, minibatch)  # noqa: E731
            actions, old_log_probs = take(samples["actions"]), take(samples["log_probs"])
            advantages = ppo.normalize(take(samples["advantages"]))
            returns = self.model.normalize_returns(take(samples["returns"]))
            self.optimizer.zero_grad()
            return self.model.loss_gradients(
                {key: take(obs) for key, obs in samples["obs"].items()},
                lambda logits, values: ppo.discrete_loss_and_grads(
                    logits,
                    values,
                    actions,
                    old_log_probs,
                    advantages,
                    returns,
                    lcfg.ppo_clip_ratio,
                    lcfg.value_loss_coeff,
                    lcfg.entropy_coeff,
                )[1:],
            )

        return self._optimize(samples["log_probs"].numel(), direct)

    def _ppo_epochs_recurrent(self, seq: dict) -> dict:
        """Recurrent: minibatches of whole sequences (every field [R, M, ...], M sequences; `states`
        [M, H] where each starts); the core is re-run from there and the losses cover kept samples."""
        recurrence = seq["keep"].shape[0]

        def minibatch_outputs(minibatch):
            obs = {
                key: value[:, minibatch].reshape(recurrence * len(minibatch), *value.shape[2:])
                for key, value in seq["obs"].items()
            }
            params, values, _ = self.model.forward_sequence(obs, seq["states"][minibatch], seq["starts"][:, minibatch])
            kept = seq["keep"][:, minibatch].reshape(-1).nonzero().squeeze(1)
            pick = lambda x: x[:, minibatch].reshape(-1, *x.shape[2:])[kept]  # noqa: E731
            return (
                params[kept],
                values[kept],
                pick(seq["actions"]),
                pick(seq["log_probs"]),
                pick(seq["advantages"]),
                pick(seq["returns"]),
            ) + ((pick(seq["acting"]),) if "acting" in seq else ())

        return self._optimize(seq["keep"].shape[1], self._autograd_gradients(minibatch_outputs), unit=recurrence)

    def _autograd_gradients(self, minibatch_outputs):
        """gradients(indices) for _optimize, through autograd: minibatch_outputs(indices) = (distribution
        parameters, values, actions, behaviour log-probs, advantages, returns) of its kept samples."""

        def gradients(minibatch):
            outputs = minibatch_outputs(minibatch)
            if outputs[1].numel() < 2:
                return None
            loss, stats = self._loss(*outputs)
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

    def _optimize(self, num_units: int, gradients, unit: int = 1) -> dict:
        """--num_epochs passes of minibatches (`_minibatches`) over `num_units` samples or sequences (of
        `unit` samples), each a clipped PPO step: gradients(indices) puts the minibatch's loss gradients
        into the optimizer's gradient and returns the loss stats [5] (None: too few samples, skipped)."""
        lcfg = self.lcfg
        self._set_learning_rate()
        totals = torch.zeros(6)
        num_updates = 0
        minibatches = self._minibatches(num_units, unit)
        for _ in range(lcfg.num_epochs):
            for minibatch in torch.randperm(num_units, device=self.device).tensor_split(minibatches):
                if minibatch.numel() < 1 or self.ctx.stopping:  # a stopping run does not wait for epochs
                    continue
                self.ctx.beat()
                stats = gradients(minibatch)
                if stats is None:
                    continue
                grad_norm = self.optimizer.clip_grad_norm(lcfg.max_grad_norm)
                self.optimizer.step()
                totals += torch.cat([stats.detach(), grad_norm.detach().reshape(1)]).cpu()
                num_updates += 1
        names = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm")
        return {name: float(v) / max(num_updates, 1) for name, v in zip(names, totals)}

    def _loss(self, params, values, actions, old_log_probs, advantages, returns, acting=None):
        """(the PPO loss of a minibatch, its stats [policy loss, value loss, entropy, approx KL, clip
        fraction]); categorical actions take the fused loss (ppo.DiscretePPOLoss). `acting` [B] (turn-based
        games): the samples whose agent was to move, the only ones the policy's terms cover."""
        lcfg, model = self.lcfg, self.model
        advantages, returns = ppo.normalize(advantages, acting), model.normalize_returns(returns)
        if model.distribution.kind == "discrete" and acting is None:
            return ppo.DiscretePPOLoss.apply(
                params,
                values,
                actions,
                old_log_probs,
                advantages,
                returns,
                lcfg.ppo_clip_ratio,
                lcfg.value_loss_coeff,
                lcfg.entropy_coeff,
            )
        log_probs, entropy = model.log_prob_entropy(params, actions)
        losses = ppo.ppo_losses(
            log_probs, old_log_probs, advantages, values, returns, entropy, lcfg.ppo_clip_ratio, weight=acting
        )
        policy_loss, value_loss, entropy_mean = losses[:3]
        loss = policy_loss + lcfg.value_loss_coeff * value_loss - lcfg.entropy_coeff * entropy_mean
        return loss, torch.stack([x.detach() for x in losses])
