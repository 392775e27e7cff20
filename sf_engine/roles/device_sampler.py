"""Device sampler: device mode's one process per batch of a device env (envs.device): the env, the acting network
and the writing of the trajectory slots, together on the run's --device; no rollout worker and no policy worker.

Runs in a device-sampler process (or the runner in serial and sync mode's one process) with torch. Its
--num_envs_per_worker envs are --worker_num_splits groups of envs_per_split rows, a trajectory slot each: one
`step` takes a free slot for every group, plays --rollout steps of the whole batch (one forward pass and one env
step each), writes every row of every slot and hands the slots to the learner, tagged with the policy version
that acted. The learner trains on them as on a rollout worker's. On a GPU the slots' observations are in its memory
(sf_engine.runtime.device_slots): they are written there, never copied to the host.

The slots keep the engine's layout of an episode end (the step after it is a reset step, not trained on): a
NEXT_STEP env has it as it is; for a SAME_STEP env the row after an end stores the ended episode's last observation
(info['final_obs'], what a truncated step bootstraps from, its value among the behaviour values) while the network
acts on the new episode's first, and that step's reward counts in the new episode's return. The first transition
of each episode of a SAME_STEP env is the one the learner does not train on.

The rollout workers' non-finite guard (sf_engine.roles.non_finite) checks the slot rows as they reach shared memory:
a step with a non-finite observation, reward or continuous action is not trained on, its values are 0 in the slot
and on the device (the network never acts on one), and each env that gave one is named once.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from sf_engine.algo.acting import build_policy
from sf_engine.algo.base import all_finite
from sf_engine.config.parallel import node_seed
from sf_engine.envs.device import make_device_env
from sf_engine.envs.registry import SEED_MODULUS
from sf_engine.model.acting import ActContext
from sf_engine.model.flat_state import flatten_state
from sf_engine.roles.non_finite import NON_FINITE, NonFiniteGuard, zero_non_finite
from sf_engine.runtime.device_slots import settle, slot_obs_arrays
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
        seed = (
            node_seed(cfg.parallel, cfg.env.seed) * 1_000_003
            + (self.idx + ctx.generation * s.num_workers) * self.num_envs
        )
        obs, _ = self.env.reset(seed=seed % SEED_MODULUS)
        self.key = spec.obs[0][0]
        self.guard = NonFiniteGuard(ctx.buffers, cfg.env.env, self.idx, self.num_splits, self.envs_per_split)
        self.float_obs = self.key in self.guard.obs_keys
        obs, bad = self._fresh_obs(obs, None)
        self.acting_obs = self.stored_obs = obs  # what the network acts on; what the slot's next row 0 holds
        self.next_valid = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        self.skipped = None  # the next row 0's rows skipped for a non-finite obs, per group (None: none)
        if bad is not None:
            self.next_valid &= torch.as_tensor(~bad, device=self.device)
            self.skipped = self._by_group(bad)
        self.model = build_policy(spec, cfg, cfg.run.bf16).to(self.device).requires_grad_(False)
        self.params = flatten_state(self.model)
        self.weights, self.version = ctx.weights(0), -1
        # each env's index among the run's acting rows (sampler w's env e is row w x E + e), where the envs act
        self.rows = torch.arange(self.num_envs, device=self.device) + self.idx * self.num_envs
        self.num_rows, self.env_steps_base = cfg.sampler.num_workers * self.num_envs, ctx.plan.env_steps_base
        self._plan_actions(spec.action)
        self.views = self._slot_views()
        self.episode_return = np.zeros(self.num_envs)  # kept on the host from the slots' rows, once per rollout
        self.episode_length = np.zeros(self.num_envs, np.int64)
        self.finished_returns, self.finished_lengths = [], []
        self.slots: list = []  # the free slots taken so far for the next rollout
        self.timer = StageTimer(*SamplerStage)
        self.last_stats_time = time.monotonic()

    def _plan_actions(self, action) -> None:
        """How the network's actions become the env's: continuous ones clipped to the bounds (the slot keeps the
        sample), discrete ones moved to the env's first value."""
        as_tensor = lambda values: torch.as_tensor(np.asarray(values, np.float32), device=self.device)  # noqa: E731
        self.bounds = (as_tensor(action.low), as_tensor(action.high)) if action.kind == "continuous" else None
        self.start = int(action.start[0]) if action.start else 0

    def _slot_views(self) -> dict:
        """Tensor views of the slot arrays this sampler writes: the observations where they live (on a GPU its
        memory, sf_engine.runtime.device_slots), the rest in the run's shared memory."""
        buf = self.buffers
        names = ("actions", "log_probs", "values", "policy_version", "rewards", "terminated", "truncated", "valid")
        views = {name: torch.from_numpy(getattr(buf, name)) for name in names}
        views["obs"] = torch.as_tensor(slot_obs_arrays(self.ctx)[self.key])  # a NumPy array's: a view of it
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

    def _context(self) -> ActContext:
        """What this sampler knows of its rows as a rollout starts (the acting network decides how they act)."""
        env_steps = self.env_steps_base + int(self.buffers.env_steps.sum())
        return ActContext(
            training=True, env_steps=env_steps, version=self.version, rows=self.rows, num_rows=self.num_rows
        )

    def _rollout(self, slots: list) -> None:
        """--rollout steps of every env into `slots` (one per group), handed over at the end."""
        buf = self.buffers
        buf.slot_rows[slots] = 0
        buf.non_finite[slots] = False
        self._write(slots, 0, obs=self.stored_obs, valid=self.next_valid)
        if self.skipped is not None:
            buf.non_finite[slots, 0] = self.skipped
        ctx = self._context()
        ended = None  # a SAME_STEP env's rows whose episode just ended: their values are those of the last obs
        for row in range(self.rollout):
            actions, log_probs, values = self._act(ctx, ended)
            self.timer.lap(SamplerStage.FORWARD)
            self._write(slots, row, actions=actions, log_probs=log_probs, values=values)
            bad_actions = self._zero_non_finite(slots, row, "actions") if self.guard.actions else None
            if bad_actions is not None:
                actions = actions.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
            self.timer.lap(SamplerStage.WRITE_SLOT)
            obs, rewards, terminated, truncated, info = self.env.step(self._env_actions(actions))
            self.timer.lap(SamplerStage.ENV_STEP)
            self.guard.steps = [steps + 1 for steps in self.guard.steps]  # each group's env steps, for the log
            done = terminated | truncated
            stored = obs
            if self.same_step:
                stored = torch.where(done.reshape(-1, *[1] * (obs.dim() - 1)), info["final_obs"], obs)
                ended = torch.nonzero(done).squeeze(1)
                obs = self._fresh_obs(obs, ended)[0] if len(ended) else obs  # new episodes' first, never stored
                ended = ended if row + 1 < self.rollout else None
            self.next_valid = ~done
            self._write(slots, row, rewards=rewards, terminated=terminated, truncated=truncated)
            self._write(slots, row + 1, obs=stored, **({"valid": self.next_valid} if row + 1 < self.rollout else {}))
            self.acting_obs, self.stored_obs = obs, stored
            self._guard(slots, row, bad_actions)
            buf.env_steps[self.idx] += self.num_envs
            buf.slot_rows[slots] = row + 1
            self.timer.lap(SamplerStage.WRITE_SLOT)
        settle(self.views["obs"])  # written before the learner reads it
        for split, slot in enumerate(slots):
            buf.policy_version[slot] = self.version
            self._track_episodes(slot, split)
            buf.slot_filler[slot] = self.idx * self.num_splits + split
            self.pool.hand_over(slot)

    def _write(self, slots: list, row: int, **values) -> None:
        """Row `row` of each slot of `slots` (group k's rows of each value [N, ...] into slot k), from the device."""
        width = self.envs_per_split
        for name, value in values.items():
            view = self.views[name]
            value = value.to(view.device)
            for split, slot in enumerate(slots):
                view[slot, row] = value[split * width : (split + 1) * width]

    def _guard(self, slots: list, row: int, bad_actions) -> None:
        """The non-finite guard on step `row` of `slots` as written: its rewards, the observations after it (row + 1)
        and `bad_actions` (each group's rows whose action was not finite, or None). A step holding one is not trained
        on, nor the next where that obs was; such an obs is 0 on the device too (the network acts on it next)."""
        bad_rewards = self._zero_non_finite(slots, row, "rewards")
        bad_obs = self._zero_non_finite(slots, row + 1, "obs") if self.float_obs else None
        self.skipped = None
        if bad_actions is None and bad_rewards is None and bad_obs is None:
            return
        buf, width = self.buffers, self.envs_per_split
        next_valid = self.next_valid.cpu().numpy().reshape(self.num_splits, width)
        skipped = np.zeros_like(next_valid)
        for split, slot in enumerate(slots):
            bad = tuple(None if rows is None else rows[split] for rows in (bad_actions, bad_rewards, bad_obs))
            next_valid[split], split_skipped = self.guard.skip(split, slot, row, bad, next_valid[split])
            if split_skipped is not None:
                skipped[split] = split_skipped
            if row + 1 < self.rollout:
                buf.valid[slot, row + 1], buf.non_finite[slot, row + 1] = next_valid[split], skipped[split]
        self.next_valid = torch.as_tensor(next_valid.reshape(-1), device=self.device)
        if bad_obs is not None:
            self.skipped = skipped
            self.stored_obs = self.stored_obs.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
            self.acting_obs = self.acting_obs.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)

    def _zero_non_finite(self, slots: list, row: int, name: str) -> np.ndarray | None:
        """Each group's rows [splits, E] whose `name` value (a slot array; 'obs': the observations, where they live)
        at `row` is not finite, those values set to 0 in the slots; None when every one is."""
        if name == "obs" and self.ctx.queues.device_obs is not None:
            return self._zero_non_finite_device_obs(slots, row)
        array = self.buffers.obs[self.key] if name == "obs" else getattr(self.buffers, name)
        rows = [zero_non_finite((array[slot, row],)) for slot in slots]
        if all(bad is None for bad in rows):
            return None
        return np.stack([np.zeros(self.envs_per_split, bool) if bad is None else bad for bad in rows])

    def _zero_non_finite_device_obs(self, slots: list, row: int) -> np.ndarray | None:
        """The same for observations in the device's memory: checked there, a bool per env back only when one is not
        finite."""
        view = self.views["obs"]
        if all(all_finite(view[slot, row]) for slot in slots):
            return None
        bad = np.zeros((len(slots), self.envs_per_split), bool)
        for split, slot in enumerate(slots):
            written = view[slot, row]
            bad[split] = (~torch.isfinite(written).reshape(len(written), -1).all(1)).cpu().numpy()
            written.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        return bad

    def _fresh_obs(self, obs: torch.Tensor, rows) -> tuple:
        """A reset's observations (of `rows` [K] only, or all: None) checked: `obs` with their non-finite values set
        to 0, each env that gave one named, and those envs as a bool [N] on the host (None: none)."""
        if not self.float_obs:
            return obs, None
        part = obs if rows is None else obs[rows]
        if all_finite(part):
            return obs, None
        finite = torch.isfinite(part).reshape(len(part), -1).all(1)
        bad = np.zeros(self.num_envs, bool)
        bad[(np.arange(self.num_envs) if rows is None else rows.cpu().numpy())[~finite.cpu().numpy()]] = True
        for split, split_rows in enumerate(self._by_group(bad)):
            self.guard.name(split, split_rows, NON_FINITE[2])
        return obs.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0), bad

    def _by_group(self, rows: np.ndarray) -> np.ndarray:
        return rows.reshape(self.num_splits, self.envs_per_split)

    def _env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        if self.bounds is not None:
            return torch.clamp(actions, *self.bounds)
        return actions + self.start if self.start else actions

    def _act(self, ctx: ActContext, ended) -> tuple:
        """The actions, log-probs and values [N] of the acting observations, in one forward pass with the stored
        (last) observations of the `ended` rows (a SAME_STEP env's, or None), whose values replace theirs: the row
        after an end bootstraps the step that ended from them (their actions are not kept)."""
        obs, extra = self.acting_obs, 0 if ended is None else len(ended)
        if extra:
            obs = torch.cat([obs, self.stored_obs[ended]])
            ctx = dataclasses.replace(ctx, rows=torch.cat([ctx.rows, ctx.rows[ended]]))
        with torch.inference_mode():
            actions, log_probs, values, _ = self.model.act({self.key: obs}, None, ctx)
        if extra:
            values = values[: self.num_envs].index_copy(0, ended, values[self.num_envs :])
        return actions[: self.num_envs], log_probs[: self.num_envs], values

    def _track_episodes(self, slot: int, split: int) -> None:
        """The rollout's steps of group `split`, as written in `slot`, added to its envs' episodes; the episodes that
        ended, kept for the stats. A step counts where it was taken in an episode: every step of a SAME_STEP env, a
        NEXT_STEP env's but its reset steps."""
        buf, rows = self.buffers, slice(split * self.envs_per_split, (split + 1) * self.envs_per_split)
        returns, lengths = self.episode_return[rows], self.episode_length[rows]
        rewards, taken = buf.rewards[slot], buf.valid[slot] | buf.non_finite[slot]  # skipped steps were taken
        done = buf.terminated[slot] | buf.truncated[slot]
        for row in range(self.rollout):
            counted = 1 if self.same_step else taken[row]
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
