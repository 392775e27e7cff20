"""Learner: gathers whole trajectory slots, computes advantages, runs PPO, publishes weights.

Runs in the learner process (or the runner in serial mode) on the run's device. A training batch is
`slots_per_batch` slots, i.e. T = rollout steps x N = slots x envs per split trajectories. After the
update the new weights are copied into the shared tensor under the seqlock, the version is bumped,
and only then are the slots returned to the free pool (so in sync mode no slot is ever filled by an
older policy).
"""
from __future__ import annotations

import logging
import time

import numpy as np
import torch

from sf_engine import ppo
from sf_engine.checkpoint import load_checkpoint, save_checkpoint
from sf_engine.ipc import get_many
from sf_engine.messages import CheckpointFailed, CheckpointWritten, Recycled, Training
from sf_engine.model import ActorCritic
from sf_engine.ops import FlatAdam
from sf_engine.process import StageTimer
from sf_engine.weights import flatten_state
from sf_engine.wiring import weight_readers

_STEP_FIELDS = ("actions", "log_probs", "values", "policy_version", "rewards", "terminated", "truncated", "valid")


class Learner:
    def __init__(self, ctx):
        """Built from the run plan (the checkpoint to resume from is the plan's); publishes version 0
        (or the resumed version) before the first step."""
        plan = ctx.plan
        self.ctx, self.cfg, self.lcfg, self.buffers, self.queues = ctx, plan.cfg, plan.cfg.learner, ctx.buffers, ctx.queues
        self.checkpoint_dir, self.env_steps_base = plan.paths.checkpoint_dir, plan.env_steps_base
        self.device = torch.device(self.cfg.run.device)
        torch.manual_seed(self.cfg.env.seed % 2**63)  # any integer --seed: torch takes 64 bits
        self.model = ActorCritic(plan.spec, self.cfg.model, self.cfg.run.bf16).to(self.device)
        encoder = self.model.actor_encoder  # [C, H, W] images: kept as [H, W, C] rows for the minibatches,
        self.chw_images = encoder.image_keys - encoder.hwc_keys  # reordered once per batch, not per minibatch
        self.params = flatten_state(self.model)
        self.optimizer = FlatAdam(self.model, self.params, lr=self.lcfg.learning_rate, eps=self.lcfg.adam_eps)
        self.version = 0
        if plan.resume_from:
            self._load(plan.resume_from)
        self.weights = ctx.weights()
        self.weights.create(self.params, self.version, weight_readers(self.cfg))
        self.pending_slots: list = []
        self.last_save_time = time.monotonic()
        self.timer = StageTimer("wait_data", "batch_assembly", "train", "weight_publish", "checkpoint")

    def describe(self) -> str:
        return f"version {self.version} published, weights shared on {self.weights.shared.device}"

    def _load(self, path: str) -> None:
        state = load_checkpoint(path, self.device)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # this run's --learning_rate, not the saved one
            group["lr"] = self.lcfg.learning_rate
        self.version = int(state["version"])
        logging.info("resumed from %s (version %d)", path, self.version)

    @property
    def env_steps(self) -> int:
        return self.env_steps_base + int(self.buffers.env_steps.sum())

    def step(self, timeout_sec: float) -> None:
        """Wait (at most `timeout_sec`) for full slots; train once a whole batch has arrived."""
        needed = self.cfg.slots_per_batch - len(self.pending_slots)
        self.timer.start()
        self.ctx.beat()
        self.weights.serve_requests()  # a restarted policy worker or evaluator needs the shared weights
        self.pending_slots += get_many(self.queues.full_slots, timeout_sec, max_messages=needed)
        self.timer.lap("wait_data")
        if self.cfg.run.sampling_only:
            if self.pending_slots:
                self.ctx.send(Recycled(self.buffers.take_rows(self.pending_slots)))
                self.queues.free_slots.put_many(self.pending_slots)
            self.pending_slots = []
        elif len(self.pending_slots) == self.cfg.slots_per_batch:
            slots, self.pending_slots = self.pending_slots, []
            self.train_on(slots)
        if time.monotonic() - self.last_save_time > self.cfg.run.save_every_sec and not self.cfg.run.sampling_only:
            self.timer.start()
            self.save()
            self.timer.lap("checkpoint")

    def finish(self) -> None:
        """The run stops: a last checkpoint."""
        if not self.cfg.run.sampling_only:
            self.save()

    def close(self) -> None:
        pass

    def _gather(self, slots: list) -> dict:
        """Copy the slots out of shared memory, time-major: obs[key] [T+1, N, *shape], the step fields
        [T, N, ...] (N = slots x envs per split)."""
        index = np.asarray(slots)

        def time_major(array):  # [S, R, E, ...] -> [R, S * E, ...]
            picked = array[index].swapaxes(0, 1)
            return torch.from_numpy(np.ascontiguousarray(picked).reshape(picked.shape[0], -1, *picked.shape[3:]))

        batch = {name: time_major(getattr(self.buffers, name)) for name in _STEP_FIELDS}
        batch["obs"] = {key: time_major(array) for key, array in self.buffers.obs.items()}
        if self.model.recurrent:  # episode_start [T+1, N], rnn_states [T+1, N, H]
            batch["episode_start"] = time_major(self.buffers.episode_start)
            batch["rnn_states"] = time_major(self.buffers.rnn_states)
        return {k: ({kk: vv.to(self.device) for kk, vv in v.items()} if isinstance(v, dict) else v.to(self.device))
                for k, v in batch.items()}

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
                return ppo.gae(batch["rewards"], values, batch["terminated"], dones, batch["valid"],
                               lcfg.gamma, lcfg.gae_lambda)
            actions = batch["actions"].reshape(num_steps * num_traj, *batch["actions"].shape[2:])
            target_log_probs, _ = model.log_prob_entropy(params[:num_steps * num_traj], actions)
            vs, advantages = ppo.vtrace(batch["log_probs"], target_log_probs.reshape(num_steps, num_traj),
                                        batch["rewards"], values, batch["terminated"], dones, batch["valid"],
                                        lcfg.gamma, lcfg.vtrace_rho_bar, lcfg.vtrace_c_bar)
            return advantages, vs

    def train_on(self, slots: list) -> None:
        self.timer.start()
        batch = self._gather(slots)
        lag = self.version - batch["policy_version"]
        valid = batch["valid"]
        keep = valid & (lag <= self.lcfg.max_policy_lag)
        advantages, returns = self._targets(batch)
        index = keep.reshape(-1).nonzero().squeeze(1)
        flat = lambda x: x.reshape(-1, *x.shape[2:]).index_select(0, index)  # noqa: E731  [T, N, ...] -> kept
        samples = {"obs": {key: flat(value[:-1].permute(0, 1, 3, 4, 2) if key in self.chw_images else value[:-1])
                           for key, value in batch["obs"].items()},
                   "actions": flat(batch["actions"]), "log_probs": flat(batch["log_probs"]),
                   "advantages": flat(advantages), "returns": flat(returns)}
        self.timer.lap("batch_assembly")
        losses = {}
        if index.numel():
            losses = (self._ppo_epochs_recurrent(self._sequences(batch, keep, advantages, returns))
                      if self.model.recurrent else self._ppo_epochs(samples))
            # after the epochs: the behaviour log-probs were computed with the statistics in force
            self.model.update_normalizers(samples["obs"], samples["returns"])
        self.timer.lap("train")
        self.version += 1
        self.weights.publish(self.params, self.version)
        self.buffers.take_rows(slots)
        self.queues.free_slots.put_many(list(slots))
        self.timer.lap("weight_publish")
        valid_lag = lag[valid].float() if bool(valid.any()) else torch.zeros(1)
        self.ctx.send(Training(
            self.timer.report("learner"), version=self.version, samples=int(index.numel()),
            dropped_lag=int((valid & ~keep).sum()), not_trainable=int((~valid).sum()), lag_count=int(valid.sum()),
            lag_min=float(valid_lag.min()), lag_mean=float(valid_lag.mean()), lag_max=float(valid_lag.max()),
            learning_rate=self.optimizer.param_groups[0]["lr"], losses=losses))

    def _sequences(self, batch: dict, keep, advantages, returns) -> dict:
        """The batch cut into whole --recurrence-long sequences: [R, M, ...] per field (see
        ppo.sequence_index), with the stored state each sequence starts from."""
        num_steps, num_traj = keep.shape
        index = ppo.sequence_index(num_steps, num_traj, self.lcfg.recurrence).to(self.device)
        cut = lambda x: x.reshape(num_steps * num_traj, *x.shape[2:])[index]  # noqa: E731
        return {"obs": {key: cut(value[:-1]) for key, value in batch["obs"].items()},
                "actions": cut(batch["actions"]), "log_probs": cut(batch["log_probs"]),
                "advantages": cut(advantages), "returns": cut(returns), "keep": cut(keep),
                "starts": cut(batch["episode_start"][:-1]),
                "states": batch["rnn_states"][:-1].reshape(num_steps * num_traj, -1)[index[0]]}

    def _set_learning_rate(self) -> None:
        if self.lcfg.lr_schedule == "linear":
            fraction_left = max(0.0, 1.0 - self.env_steps / self.cfg.run.train_for_env_steps)
            for group in self.optimizer.param_groups:
                group["lr"] = self.lcfg.learning_rate * fraction_left

    def _ppo_epochs(self, samples: dict) -> dict:
        """Feed-forward: minibatches of kept samples (flat [B, ...])."""
        def minibatch_outputs(minibatch):
            take = lambda x: x.index_select(0, minibatch)  # noqa: E731  (a row copy: faster than x[minibatch])
            params, values = self.model({key: take(obs).permute(0, 3, 1, 2) if key in self.chw_images else take(obs)
                                         for key, obs in samples["obs"].items()})
            return (params, values, take(samples["actions"]), take(samples["log_probs"]), take(samples["advantages"]),
                    take(samples["returns"]))

        if not self.model.direct_gradients(samples["obs"]):
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
                    logits, values, actions, old_log_probs, advantages, returns, lcfg.ppo_clip_ratio,
                    lcfg.value_loss_coeff, lcfg.entropy_coeff)[1:])

        return self._optimize(samples["log_probs"].numel(), direct)

    def _ppo_epochs_recurrent(self, seq: dict) -> dict:
        """Recurrent: minibatches of whole sequences (every field [R, M, ...], M sequences; `states`
        [M, H] where each starts); the core is re-run from there and the losses cover kept samples."""
        recurrence = seq["keep"].shape[0]

        def minibatch_outputs(minibatch):
            obs = {key: value[:, minibatch].reshape(recurrence * len(minibatch), *value.shape[2:])
                   for key, value in seq["obs"].items()}
            params, values, _ = self.model.forward_sequence(obs, seq["states"][minibatch], seq["starts"][:, minibatch])
            kept = seq["keep"][:, minibatch].reshape(-1).nonzero().squeeze(1)
            pick = lambda x: x[:, minibatch].reshape(-1, *x.shape[2:])[kept]  # noqa: E731
            return (params[kept], values[kept], pick(seq["actions"]), pick(seq["log_probs"]), pick(seq["advantages"]),
                    pick(seq["returns"]))

        return self._optimize(seq["keep"].shape[1], self._autograd_gradients(minibatch_outputs))

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

    def _optimize(self, num_units: int, gradients) -> dict:
        """--num_epochs passes of --num_batches_per_epoch minibatches over `num_units` samples or
        sequences, each a clipped PPO step: gradients(indices) puts the minibatch's loss gradients into the
        optimizer's gradient and returns the loss stats [5] (None: too few samples, skipped)."""
        lcfg = self.lcfg
        self._set_learning_rate()
        totals = torch.zeros(6)
        num_updates = 0
        for _ in range(lcfg.num_epochs):
            for minibatch in torch.randperm(num_units, device=self.device).tensor_split(lcfg.num_batches_per_epoch):
                if minibatch.numel() < 1 or self.ctx.stopping:  # a stopping run does not wait for epochs
                    continue
                self.ctx.beat()
                stats = gradients(minibatch)
                if stats is None:
                    continue
                grad_norm = self.optimizer.clip_grad_norm(lcfg.max_grad_norm)
                self.optimizer.step()
                totals += torch.cat([stats, grad_norm.detach().reshape(1)]).cpu()
                num_updates += 1
        names = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm")
        return {name: float(v) / max(num_updates, 1) for name, v in zip(names, totals)}

    def _loss(self, params, values, actions, old_log_probs, advantages, returns):
        """(the PPO loss of a minibatch, its stats [policy loss, value loss, entropy, approx KL, clip
        fraction]); categorical actions take the fused loss (ppo.DiscretePPOLoss)."""
        lcfg, model = self.lcfg, self.model
        advantages, returns = ppo.normalize(advantages), model.normalize_returns(returns)
        if model.distribution.kind == "discrete":
            return ppo.DiscretePPOLoss.apply(params, values, actions, old_log_probs, advantages, returns,
                                             lcfg.ppo_clip_ratio, lcfg.value_loss_coeff, lcfg.entropy_coeff)
        log_probs, entropy = model.log_prob_entropy(params, actions)
        losses = ppo.ppo_losses(log_probs, old_log_probs, advantages, values, returns, entropy, lcfg.ppo_clip_ratio)
        policy_loss, value_loss, entropy_mean = losses[:3]
        loss = policy_loss + lcfg.value_loss_coeff * value_loss - lcfg.entropy_coeff * entropy_mean
        return loss, torch.stack([x.detach() for x in losses])

    def save(self):
        """Write a checkpoint; on a full disk (or any OSError) keep the previous one, warn, and go on.
        Returns the path, or None when the write failed."""
        env_steps = self.env_steps  # one reading for the file's contents and its name
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "version": self.version, "env_steps": env_steps, "config": self.cfg.to_dict()}
        self.last_save_time = time.monotonic()
        try:
            path = save_checkpoint(self.checkpoint_dir, state, self.version, env_steps,
                                   self.cfg.run.keep_checkpoints)
        except OSError as exc:
            logging.warning("checkpoint of version %d not written (%s); the previous one is kept",
                            self.version, exc.strerror or exc)
            self.ctx.send(CheckpointFailed(str(exc.strerror or exc)))
            return None
        self.ctx.send(CheckpointWritten(path))
        return path
