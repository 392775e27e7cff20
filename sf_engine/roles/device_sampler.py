"""Device sampler: device mode's one process per batch of a device env (envs.device): the env, the acting network
and the writing of the trajectory slots, together on the run's --device; no rollout worker and no policy worker.

Runs in a device-sampler process (or the runner in serial and sync mode's one process) with torch. Its
--num_envs_per_worker envs are --worker_num_splits groups of envs_per_split rows, a trajectory slot each: one
`step` takes a free slot for every group, plays --rollout steps of the whole batch (one forward pass and one env
step each), writes every row of every slot and hands the slots to the learner, tagged with the policy version
that acted. The learner trains on them as on a rollout worker's.

The slots keep the engine's layout of an episode end (the step after it is a reset step, not trained on): a
NEXT_STEP env has it as it is; for a SAME_STEP env the row after an end stores the ended episode's last observation
(info['final_obs'], what a truncated step bootstraps from, its value among the behaviour values) while the network
acts on the new episode's first, and that step's reward counts in the new episode's return. The first transition
of each episode of a SAME_STEP env is the one the learner does not train on.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from sf_engine.algo.acting import build_policy
from sf_engine.envs.device import make_device_env
from sf_engine.envs.registry import SEED_MODULUS
from sf_engine.model.flat_state import flatten_state
from sf_engine.model.q_network import base_epsilon, epsilon_exponents
from sf_engine.runtime.slot_pool import SlotPool
from sf_engine.stats.messages import Episodes
from sf_engine.stats.stages import SamplerStage, StageTimer

STATS_EVERY_SEC = 0.5


class DeviceSampler:
    def __init__(self, ctx):
        """Makes and resets the env batch on the run's device (a restarted sampler, `ctx.generation` > 0, with new
        seeds) and builds the acting network."""
        cfg, spec = ctx.cfg, ctx.plan.spec
        s = cfg.sampler
        self.ctx, self.idx, self.buffers = ctx, ctx.index, ctx.buffers
        self.pool = SlotPool(ctx.buffers, ctx.queues)
        self.device = torch.device(cfg.run.device)
        self.rollout, self.num_splits, self.envs_per_split = s.rollout, s.worker_num_splits, s.envs_per_split
        self.num_envs = s.num_envs_per_worker
        self.env = make_device_env(cfg.env.env, self.num_envs, cfg.run.device)
        self.same_step = self.env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        seed = cfg.env.seed * 1_000_003 + (self.idx + ctx.generation * s.num_workers) * self.num_envs
        obs, _ = self.env.reset(seed=seed % SEED_MODULUS)
        self.key = spec.obs[0][0]
        self.acting_obs = self.stored_obs = obs  # what the network acts on; what the slot's next row 0 holds
        self.next_valid = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        self.model = build_policy(spec, cfg, cfg.run.bf16).to(self.device).requires_grad_(False)
        self.params = flatten_state(self.model)
        self.weights, self.version = ctx.weights(0), -1
        self._plan_exploration(cfg)
        self._plan_actions(spec.action)
        self.views = self._slot_views()
        self.episode_return = torch.zeros(self.num_envs, dtype=torch.float64, device=self.device)
        self.episode_length = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self.finished_returns, self.finished_lengths = [], []
        self.slots: list = []  # the free slots taken so far for the next rollout
        self.timer = StageTimer(*SamplerStage)
        self.last_stats_time = time.monotonic()

    def _plan_exploration(self, cfg) -> None:
        """Epsilon-greedy acting (a Q-network: each row's Ape-X exponent, row i of the run's N being sampler w's
        env e at i = w x E + e), or uniform actions before the first update (where the algorithm acts so)."""
        self.qcfg = cfg.q if cfg.acts_on_q else None
        rows = cfg.sampler.num_workers * self.num_envs
        exponents = epsilon_exponents(rows, cfg.q.apex_alpha)[self.idx * self.num_envs : (self.idx + 1) * self.num_envs]
        self.exponents = torch.as_tensor(exponents, dtype=torch.float32, device=self.device)
        self.uniform_before_learning = cfg.algorithm.random_before_learning and cfg.replay.random_before_learning
        self.env_steps_base = self.ctx.plan.env_steps_base

    def _plan_actions(self, action) -> None:
        """How the network's actions become the env's: continuous ones clipped to the bounds (the slot keeps the
        sample), discrete ones moved to the env's first value."""
        as_tensor = lambda values: torch.as_tensor(np.asarray(values, np.float32), device=self.device)  # noqa: E731
        self.bounds = (as_tensor(action.low), as_tensor(action.high)) if action.kind == "continuous" else None
        self.start = int(action.start[0]) if action.start else 0

    def _slot_views(self) -> dict:
        """Tensor views of the slot arrays this sampler writes, in the run's shared memory."""
        buf = self.buffers
        names = ("actions", "log_probs", "values", "policy_version", "rewards", "terminated", "truncated", "valid")
        views = {name: torch.from_numpy(getattr(buf, name)) for name in names}
        views["obs"] = torch.from_numpy(buf.obs[self.key])
        return views

    def describe(self) -> str:
        mode = "same-step" if self.same_step else "next-step"
        return f"{self.num_envs} envs of {self.ctx.cfg.env.env} on {self.device} ({mode} resets)"

    def step(self, timeout_sec: float) -> None:
        """One rollout into a free slot of every group, once the weights are here and every slot is taken (polled
        for at most `timeout_sec`)."""
        self.timer.start()
        self.ctx.beat()
        if not self.weights.connect("device_sampler", timeout_sec):
            self.timer.lap(SamplerStage.WAIT_SLOT)
            return
        missing = self.num_splits - len(self.slots)
        if missing:
            self.slots += self.pool.take_free(missing, self.idx, timeout_sec)
        self.timer.lap(SamplerStage.WAIT_SLOT)
        if len(self.slots) == self.num_splits:
            self._reload_weights()
            self._rollout(self.slots)
            self.slots = []
        if time.monotonic() - self.last_stats_time > STATS_EVERY_SEC:
            self.send_stats()

    def _reload_weights(self) -> None:
        if self.weights.version != self.version:
            version = self.weights.read_into(self.params)  # None: the learner is being replaced
            if version is not None:
                self.version = version
                self.model.refresh_bf16_acting()
        self.timer.lap(SamplerStage.WEIGHT_RELOAD)

    def _explore(self) -> dict:
        if self.qcfg is not None:
            env_steps = self.env_steps_base + int(self.buffers.env_steps.sum())
            return {"epsilons": base_epsilon(self.qcfg, env_steps) ** self.exponents}
        return {"uniform": True} if self.uniform_before_learning and self.version <= 0 else {}

    def _rollout(self, slots: list) -> None:
        """--rollout steps of every env into `slots` (one per group), handed over at the end."""
        buf, views, shape = self.buffers, self.views, (self.num_splits, self.envs_per_split)
        index = torch.as_tensor(slots)
        buf.slot_rows[slots] = 0
        buf.non_finite[slots] = False
        views["obs"][index, 0] = self.stored_obs.reshape(*shape, *self.stored_obs.shape[1:]).to("cpu")
        views["valid"][index, 0] = self.next_valid.reshape(shape).to("cpu")
        explore, ends = self._explore(), []
        final_values = None  # a SAME_STEP env's value of the last observation of the episodes that just ended
        for row in range(self.rollout):
            with torch.inference_mode():
                actions, log_probs, values, _ = self.model.sample({self.key: self.acting_obs}, None, **explore)
            if final_values is not None:
                values = torch.where(final_values[0], final_values[1], values)
            self.timer.lap(SamplerStage.FORWARD)
            for name, value in (("actions", actions), ("log_probs", log_probs), ("values", values)):
                views[name][index, row] = value.reshape(*shape, *value.shape[1:]).to("cpu")
            views["policy_version"][index, row] = self.version
            self.timer.lap(SamplerStage.WRITE_SLOT)
            obs, rewards, terminated, truncated, info = self.env.step(self._env_actions(actions))
            self.timer.lap(SamplerStage.ENV_STEP)
            done = terminated | truncated
            ended = done.reshape(-1, *[1] * (obs.dim() - 1))
            stored = torch.where(ended, info["final_obs"], obs) if self.same_step else obs
            final_values = self._final_values(stored, done) if self.same_step and row + 1 < self.rollout else None
            for name, value in (("rewards", rewards), ("terminated", terminated), ("truncated", truncated)):
                views[name][index, row] = value.reshape(shape).to("cpu")
            views["obs"][index, row + 1] = stored.reshape(*shape, *stored.shape[1:]).to("cpu")
            counted = torch.ones_like(done) if self.same_step else self.next_valid
            ends.append(self._track_episodes(rewards, counted, done))
            self.next_valid = ~done
            if row + 1 < self.rollout:
                views["valid"][index, row + 1] = self.next_valid.reshape(shape).to("cpu")
            buf.env_steps[self.idx] += self.num_envs
            buf.slot_rows[slots] = row + 1
            self.acting_obs, self.stored_obs = obs, stored
            self.timer.lap(SamplerStage.WRITE_SLOT)
        for split, slot in enumerate(slots):
            buf.slot_filler[slot] = self.idx * self.num_splits + split
            self.pool.hand_over(slot)
        self._collect_episodes(ends)

    def _env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        if self.bounds is not None:
            return torch.clamp(actions, *self.bounds)
        return actions + self.start if self.start else actions

    def _final_values(self, stored: torch.Tensor, done: torch.Tensor):
        """(done [N], the behaviour value of each row's stored observation [N]) where an episode ended, for the row
        after it (its bootstrap); None where none did."""
        if not bool(done.any()):
            return None
        with torch.inference_mode():
            _, _, values, _ = self.model.sample({self.key: stored}, None)
        return done, values

    def _track_episodes(self, rewards, counted, done) -> tuple:
        """Adds the step to each env's episode; returns (done, the returns and lengths of the episodes that ended)."""
        self.episode_return += rewards * counted
        self.episode_length += counted
        ended = (done, self.episode_return.clone(), self.episode_length.clone())
        self.episode_return.masked_fill_(done, 0.0)
        self.episode_length.masked_fill_(done, 0)
        return ended

    def _collect_episodes(self, ends: list) -> None:
        """The episodes of a rollout that ended, to the host once per rollout."""
        done, returns, lengths = (torch.stack(part).cpu() for part in zip(*ends))
        self.finished_returns += returns[done].tolist()
        self.finished_lengths += lengths[done].tolist()

    def send_stats(self) -> None:
        """Episodes finished since the last call (the last 100 in full) and stage times."""
        self.ctx.send(
            Episodes(
                self.timer.report(self.ctx.name),
                len(self.finished_returns),
                self.finished_returns[-100:],
                self.finished_lengths[-100:],
            )
        )
        self.finished_returns, self.finished_lengths = [], []
        self.last_stats_time = time.monotonic()

    def finish(self) -> None:
        self.send_stats()

    def close(self) -> None:
        try:
            self.env.close()
        except Exception:  # a user's env that fails to close: the run stops anyway
            logging.exception("closing %s", self.ctx.cfg.env.env)
