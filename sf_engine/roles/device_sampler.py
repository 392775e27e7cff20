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
        self.episode_return = np.zeros(self.num_envs)  # kept on the host from the slots' rows, once per rollout
        self.episode_length = np.zeros(self.num_envs, np.int64)
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
        buf = self.buffers
        buf.slot_rows[slots] = 0
        buf.non_finite[slots] = False
        self._write(slots, 0, obs=self.stored_obs, valid=self.next_valid)
        explore = self._explore()
        ended = None  # a SAME_STEP env's rows whose episode just ended: their values are those of the last obs
        for row in range(self.rollout):
            actions, log_probs, values = self._act(explore, ended)
            self.timer.lap(SamplerStage.FORWARD)
            self._write(slots, row, actions=actions, log_probs=log_probs, values=values)
            self.timer.lap(SamplerStage.WRITE_SLOT)
            obs, rewards, terminated, truncated, info = self.env.step(self._env_actions(actions))
            self.timer.lap(SamplerStage.ENV_STEP)
            done = terminated | truncated
            stored = obs
            if self.same_step:
                stored = torch.where(done.reshape(-1, *[1] * (obs.dim() - 1)), info["final_obs"], obs)
                ended = torch.nonzero(done).squeeze(1) if row + 1 < self.rollout else None
            self.next_valid = ~done
            self._write(slots, row, rewards=rewards, terminated=terminated, truncated=truncated)
            self._write(slots, row + 1, obs=stored, **({"valid": self.next_valid} if row + 1 < self.rollout else {}))
            buf.env_steps[self.idx] += self.num_envs
            buf.slot_rows[slots] = row + 1
            self.acting_obs, self.stored_obs = obs, stored
            self.timer.lap(SamplerStage.WRITE_SLOT)
        for split, slot in enumerate(slots):
            buf.policy_version[slot] = self.version
            self._track_episodes(slot, split)
            buf.slot_filler[slot] = self.idx * self.num_splits + split
            self.pool.hand_over(slot)

    def _write(self, slots: list, row: int, **values) -> None:
        """Row `row` of each slot of `slots` (group k's rows of each value [N, ...] into slot k), from the device."""
        width = self.envs_per_split
        for name, value in values.items():
            view, value = self.views[name], value.to("cpu")
            for split, slot in enumerate(slots):
                view[slot, row] = value[split * width : (split + 1) * width]

    def _env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        if self.bounds is not None:
            return torch.clamp(actions, *self.bounds)
        return actions + self.start if self.start else actions

    def _act(self, explore: dict, ended) -> tuple:
        """The actions, log-probs and values [N] of the acting observations, in one forward pass with the stored
        (last) observations of the `ended` rows (a SAME_STEP env's, or None), whose values replace theirs: the row
        after an end bootstraps the step that ended from them."""
        obs, extra = self.acting_obs, 0 if ended is None else len(ended)
        if extra:
            obs = torch.cat([obs, self.stored_obs[ended]])
            if "epsilons" in explore:  # the extra rows act greedily: only their values are kept
                explore = {"epsilons": torch.cat([explore["epsilons"], explore["epsilons"].new_zeros(extra)])}
        with torch.inference_mode():
            actions, log_probs, values, _ = self.model.sample({self.key: obs}, None, **explore)
        if extra:
            values = values[: self.num_envs].index_copy(0, ended, values[self.num_envs :])
        return actions[: self.num_envs], log_probs[: self.num_envs], values

    def _track_episodes(self, slot: int, split: int) -> None:
        """The rollout's steps of group `split`, as written in `slot`, added to its envs' episodes; the episodes that
        ended, kept for the stats. A step counts where it was taken in an episode: every step of a SAME_STEP env, a
        NEXT_STEP env's but its reset steps."""
        buf, rows = self.buffers, slice(split * self.envs_per_split, (split + 1) * self.envs_per_split)
        returns, lengths = self.episode_return[rows], self.episode_length[rows]
        rewards, valid = buf.rewards[slot], buf.valid[slot]
        done = buf.terminated[slot] | buf.truncated[slot]
        for row in range(self.rollout):
            counted = 1 if self.same_step else valid[row]
            returns += rewards[row] * counted
            lengths += counted
            if done[row].any():
                ended = np.flatnonzero(done[row])
                self.finished_returns += returns[ended].tolist()
                self.finished_lengths += lengths[ended].tolist()
                returns[ended], lengths[ended] = 0.0, 0

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
