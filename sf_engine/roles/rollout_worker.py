"""Rollout worker: owns num_envs_per_worker envs in worker_num_splits groups and fills trajectory slots.

Runs in a rollout-worker process (one CPU core, no torch), or in the runner in serial mode. While one
split waits for its actions from the policy worker, the worker steps the other (double buffering).
A split's cycle: write obs at [slot, row] -> request actions -> step envs with actions[slot, row] ->
write rewards/dones at row and obs at row + 1 -> ... -> at row == rollout hand the slot to the learner
and take a free one.

A restarted worker (same index, next `generation`) gets fresh envs with new seeds. Requests and replies
carry a token `generation x splits + split`, so replies meant for a dead predecessor are ignored.
The worker marks the slots it fills in `slot_owner` and counts their rows in `slot_rows`, so the runner
can take back a dead worker's half-written slots. A step with a non-finite observation, reward or action is
skipped (sf_engine.roles.non_finite).
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

from sf_engine.config.parallel import node_seed
from sf_engine.envs import make_batch_env
from sf_engine.roles.non_finite import NON_FINITE, NonFiniteGuard, zero_non_finite
from sf_engine.runtime.slot_pool import SlotPool, deterministic_rounds
from sf_engine.runtime.wiring import policy_worker_of
from sf_engine.selfplay.ratings import LOSS, outcomes
from sf_engine.stats.messages import Episodes
from sf_engine.stats.stages import StageTimer, WorkerStage

STATS_EVERY_SEC = 0.5


class RolloutWorker:
    def __init__(self, ctx):
        """Makes and resets the envs (`ctx.generation` > 0: a restarted worker, with new seeds), then
        queues each split for a free slot."""
        cfg = ctx.cfg
        self.ctx, self.idx, self.generation = ctx, ctx.index, ctx.generation
        self.buffers, self.queues, self.pool = ctx.buffers, ctx.queues, SlotPool(ctx.buffers, ctx.queues)
        self.replies = self.queues.actions_ready[self.idx]
        self.requests = self.queues.policy_requests[policy_worker_of(self.idx, ctx.cfg)]  # its policy worker's
        s = cfg.sampler
        self.rollout, self.num_splits, self.envs_per_split = s.rollout, s.worker_num_splits, s.envs_per_split
        self.envs = self._make_envs(cfg, ctx.plan.spec)
        self.slot = [-1] * self.num_splits
        self.row = [0] * self.num_splits
        # a split between two slots keeps its current obs here until a free slot arrives
        self.pending_obs: list = [None] * self.num_splits
        self.pending_valid: list = [None] * self.num_splits
        self.pending_first: list = [None] * self.num_splits  # recurrent runs: obs that start an episode
        self.pending_acting: list = [None] * self.num_splits  # turn-based runs: whose turn it is
        self.obs_skipped: list = [None] * self.num_splits  # rows of each split's current obs skipped (non-finite)
        self.guard = NonFiniteGuard(self.buffers, cfg.env.env, self.idx, self.num_splits, self.envs_per_split)
        self.waiting_for_slot: list[int] = []
        self.num_awaiting_actions = 0
        self.episode_return = np.zeros((self.num_splits, self.envs_per_split), np.float64)
        self.episode_length = np.zeros((self.num_splits, self.envs_per_split), np.int64)
        self.finished_returns: list = []
        self.finished_lengths: list = []
        self.finished_extra: dict = {}  # name -> values of the env's own episode stats
        self.finished_policies: list = []  # the policy that played each finished episode
        self.finished_seats: list = []  # multi-agent envs: the seat (agent index) of each finished episode
        self._plan_policies(cfg, ctx.plan.spec)
        self.timer = StageTimer(*WorkerStage)
        self.last_stats_time = time.monotonic()
        # --deterministic: each episode's key (its split's step, worker, env) for the order RunStats takes them in
        self.finished_order: list | None = [] if cfg.run.deterministic else None
        # --deterministic in --mode sync: the slots each split fills before it stops (the run ends at the same step)
        self.rounds_left = [deterministic_rounds(cfg, ctx.plan.env_steps_base)] * self.num_splits
        try:
            self._reset()
        except BaseException:  # the caller gets no worker to close: close the envs here
            with contextlib.suppress(Exception):  # an env that failed may fail to close too
                self.close()
            raise

    def _make_envs(self, cfg, spec) -> list:
        """One batch env per split; env i of a batch gets seed + i: batches are spaced by their size so no
        two envs share a seed, and a restarted worker's (next generation) get new ones."""
        s = cfg.sampler
        first_seed = (
            node_seed(cfg.parallel, cfg.env.seed) * 1_000_003
            + self.idx * s.num_envs_per_worker
            + self.generation * s.num_workers * s.num_envs_per_worker
        )
        return [
            make_batch_env(
                cfg.env.env,
                cfg.env.env_backend,
                self.envs_per_split,
                seed=first_seed + split * self.envs_per_split,
                spec=spec,
            )
            for split in range(self.num_splits)
        ]

    def _plan_policies(self, cfg, spec) -> None:
        """--num_policies > 1: the policy playing each row's episode, drawn when the episode starts (or
        fixed per agent by --agent_policies)."""
        pcfg = cfg.policies
        self.num_policies, self.num_acting, self.pool_share = pcfg.num_policies, pcfg.num_acting, pcfg.pool_share
        self.num_agents = spec.num_agents
        self.row_policy = np.zeros((self.num_splits, self.envs_per_split), np.int16)
        mapping = pcfg.agent_mapping(spec.agents) if self.num_policies > 1 else None
        self.fixed_policy = None if mapping is None else np.resize(np.asarray(mapping, np.int16), self.envs_per_split)
        seed = node_seed(cfg.parallel, cfg.env.seed) % 2**63  # any integer --seed
        self.rng = np.random.default_rng([seed, self.idx, self.generation])

    def describe(self) -> str:
        return f"{len(self.envs) * self.envs_per_split} envs reset (generation {self.generation})"

    def _reset(self) -> None:
        """Reset every env and queue each split for a free slot."""
        for split, env in enumerate(self.envs):
            obs = {key: np.array(value, self.buffers.obs[key].dtype) for key, value in env.reset().items()}
            alive = getattr(env, "alive", None)  # multi-agent: rows of agents absent from their game
            valid = np.ones(self.envs_per_split, bool) if alive is None else alive.copy()
            bad = zero_non_finite([obs[key] for key in self.guard.obs_keys])
            if bad is not None:
                self.obs_skipped[split], valid = bad & valid, valid & ~bad
                self.guard.name(split, bad, NON_FINITE[2])
            self.pending_obs[split], self.pending_valid[split] = obs, valid
            acting = getattr(env, "acting", None)  # turn-based multi-agent: whose turn it is
            self.pending_acting[split] = None if acting is None else acting.copy()
            self.pending_first[split] = np.ones(self.envs_per_split, bool)
            self._assign_policies(split, np.ones(self.envs_per_split, bool))
            self.waiting_for_slot.append(split)
        self._take_free_slots()

    def _assign_policies(self, split: int, rows: np.ndarray) -> None:
        """The policies that play the next episode of `rows` (a mask) of `split`: trained ones at random
        or fixed per agent; with an opponent pool, some seats go to its snapshots (never every seat of
        a game)."""
        if self.num_acting == 1 or not rows.any():
            return
        if self.buffers.match_chances is not None:
            self._match(split, rows)
            return
        chosen = (
            self.fixed_policy.copy()
            if self.fixed_policy is not None
            else self.rng.integers(0, self.num_policies, self.envs_per_split).astype(np.int16)
        )
        snapshots = np.flatnonzero(self.buffers.param_seq[self.num_policies :] > 0) + self.num_policies
        if len(snapshots):
            pooled = rows & (self.rng.random(self.envs_per_split) < self.pool_share)
            games = pooled.reshape(-1, self.num_agents)
            full = np.flatnonzero(games.all(1))  # every seat of a game pooled: one seat goes back
            games[full, self.rng.integers(0, self.num_agents, len(full))] = False
            chosen[pooled] = self.rng.choice(snapshots, int(pooled.sum()), p=self._opponent_chances(snapshots))
        self.row_policy[split, rows] = chosen[rows]

    def _match(self, split: int, rows: np.ndarray) -> None:
        """--league: each game of `rows` is led by a trained policy drawn alike, in a seat drawn alike, against an
        opponent drawn by the learner's chances for it (match_chances; itself while it has none)."""
        games = np.flatnonzero(rows.reshape(-1, 2).all(1))
        leaders = self.rng.integers(0, self.num_policies, len(games))
        cumulative = np.cumsum(self.buffers.match_chances[leaders], axis=1)
        total = cumulative[:, -1]
        drawn = (self.rng.random(len(games)) * total)[:, None] >= cumulative
        opponents = np.where(total > 0, np.minimum(drawn.sum(1), self.num_acting - 1), leaders)
        seat = self.rng.integers(0, 2, len(games))
        self.row_policy[split, 2 * games + seat] = leaders
        self.row_policy[split, 2 * games + 1 - seat] = opponents

    def _opponent_chances(self, snapshots: np.ndarray) -> np.ndarray | None:
        """The chance of each snapshot to be drawn (the learner's --opponent_sampling weights), or None: alike."""
        weights = None if self.buffers.opponent_weights is None else self.buffers.opponent_weights[snapshots]
        if weights is None or not np.isfinite(weights).all() or (weights < 0).any() or weights.sum() <= 0:
            return None
        return weights / weights.sum()

    def step(self, timeout_sec: float) -> None:
        """One unit of work: take free slots for waiting splits, then advance every split whose actions
        are ready. Blocks at most `timeout_sec` (0 in serial mode). Free slots are polled, never waited
        for on the shared queue (see ipc: a killed waiter would break it for everybody)."""
        self.timer.start()
        self.ctx.beat()
        if not self.waiting_for_slot and not self.num_awaiting_actions:  # every split done (deterministic_rounds)
            time.sleep(timeout_sec)
        if self.waiting_for_slot:
            # with no actions awaited there is nothing else to do: poll for a free slot until the timeout
            self._take_free_slots(timeout_sec if self.num_awaiting_actions == 0 else 0.0)
            self.timer.lap(WorkerStage.WAIT_SLOT)
        if self.num_awaiting_actions:
            ready = self.replies.receive(timeout_sec)
            self.timer.lap(WorkerStage.WAIT_ACTIONS)
            for token in ready:
                generation, split = divmod(token, self.num_splits)
                if generation == self.generation:  # else: the reply to a dead predecessor's request
                    self.num_awaiting_actions -= 1
                    self._advance(split)
        if time.monotonic() - self.last_stats_time > STATS_EVERY_SEC:
            self.send_stats()

    def _take_free_slots(self, timeout_sec: float = 0.0) -> None:
        for slot in self.pool.take_free(len(self.waiting_for_slot), self.idx, timeout_sec):
            split = self.waiting_for_slot.pop(0)
            self.slot[split], self.row[split] = slot, 0
            self.buffers.slot_rows[slot] = 0
            for key, value in self.pending_obs[split].items():
                self.buffers.obs[key][slot, 0] = value
            self.buffers.valid[slot, 0] = self.pending_valid[split]
            self.buffers.non_finite[slot] = False
            if self.obs_skipped[split] is not None:
                self.buffers.non_finite[slot, 0] = self.obs_skipped[split]
            if self.buffers.episode_start is not None:
                self.buffers.episode_start[slot, 0] = self.pending_first[split]
            if self.buffers.acting is not None:
                self.buffers.acting[slot, 0] = self.pending_acting[split]
            if self.buffers.policy_id is not None:
                self.buffers.policy_id[slot, 0] = self.row_policy[split]
            self._request_actions(split)

    def _request_actions(self, split: int) -> None:
        self.num_awaiting_actions += 1
        token = self.generation * self.num_splits + split
        # an InferenceRequest's fields as a plain tuple: the NamedTuple itself costs 2.7 us more a request
        # through the queue (it pickles its class), on the sampler's hottest path
        self.requests.put((self.idx, token, self.slot[split], self.row[split]))

    def _advance(self, split: int) -> None:
        """Step split's envs with the actions the policy worker wrote, record the transition."""
        buf, slot, row = self.buffers, self.slot[split], self.row[split]
        self.timer.start()
        actions = buf.actions[slot, row]
        bad_actions = zero_non_finite((actions,)) if self.guard.actions else None
        result = self.envs[split].step(actions)
        self.timer.lap(WorkerStage.ENV_STEP)
        self._record(split, slot, row, result, bad_actions)
        self.timer.lap(WorkerStage.WRITE_SLOT)

    def _record(self, split: int, slot: int, row: int, result, bad_actions=None) -> None:
        """Write the transition into the slot (a step with a non-finite value skipped: the guard's `skip`); request the
        next actions or hand the full slot over. `bad_actions`: the rows whose action was not finite."""
        buf = self.buffers
        buf.rewards[slot, row] = result.rewards
        bad_rewards = zero_non_finite((buf.rewards[slot, row],))
        score = result.score_rewards
        if bad_rewards is not None:
            score = np.nan_to_num(score, nan=0.0, posinf=0.0, neginf=0.0)
        buf.terminated[slot, row] = result.terminated
        buf.truncated[slot, row] = result.truncated
        done = np.logical_or(result.terminated, result.truncated)
        taken = buf.valid[slot, row]  # the step was taken (not a reset step): valid, or skipped for its obs
        if self.obs_skipped[split] is not None:
            taken = taken | self.obs_skipped[split]
        self._track_episodes(split, score, result.episode_over, taken, result.objective)
        if result.extra_stats:
            for name, values in result.extra_stats.items():
                self.finished_extra.setdefault(name, []).extend(values)
        row += 1
        self.guard.steps[split] += 1
        buf.env_steps[self.idx] += self.envs_per_split  # counted with the row that holds the step
        buf.slot_rows[slot] = row
        for key, value in result.obs.items():
            buf.obs[key][slot, row] = value
        bad_obs = zero_non_finite([buf.obs[key][slot, row] for key in self.guard.obs_keys])
        first = ~taken  # the step just taken was a reset step: a new episode begins
        if buf.episode_start is not None:
            buf.episode_start[slot, row] = first
        next_valid = ~done if result.alive is None else ~done & result.alive  # after an end: the reset step
        skipped = None  # the next step's rows skipped for a non-finite obs
        if bad_actions is not None or bad_rewards is not None or bad_obs is not None:
            next_valid, skipped = self.guard.skip(split, slot, row - 1, (bad_actions, bad_rewards, bad_obs), next_valid)
        self.obs_skipped[split] = skipped
        if buf.policy_id is not None:  # a row changes hands where its new episode's first obs is (the
            self._assign_policies(split, first)  # reset step and its value stay with the old policy)
            buf.policy_id[slot, row] = self.row_policy[split]
        if row < self.rollout:
            buf.valid[slot, row] = next_valid
            if skipped is not None:
                buf.non_finite[slot, row] = skipped
            if buf.acting is not None:
                buf.acting[slot, row] = result.acting
            self.row[split] = row
            self._request_actions(split)
            return
        # the bootstrap row as checked, copied before the learner may take the slot
        self.pending_obs[split] = {key: buf.obs[key][slot, row].copy() for key in result.obs}
        self.pending_valid[split] = next_valid
        self.pending_first[split] = first
        self.pending_acting[split] = result.acting
        buf.slot_filler[slot] = self.idx * self.num_splits + split
        self.pool.hand_over(slot)
        self.slot[split] = -1
        if self.rounds_left[split] is not None:
            self.rounds_left[split] -= 1
            if self.rounds_left[split] <= 0:  # the run's last round: this split stops here
                return
        self.waiting_for_slot.append(split)
        self._take_free_slots()

    def _track_episodes(self, split: int, score_rewards, episode_over, valid, objectives=None) -> None:
        """Returns of whole episodes as the user scores them (true game score on Atari)."""
        self.episode_return[split] += score_rewards * valid
        self.episode_length[split] += valid
        if episode_over.any():
            ended = np.flatnonzero(episode_over)
            self.finished_returns.extend(self.episode_return[split, ended].tolist())
            self.finished_lengths.extend(self.episode_length[split, ended].tolist())
            self.finished_policies.extend(self.row_policy[split, ended].tolist())
            self.finished_seats.extend((ended % self.num_agents).tolist())
            if self.finished_order is not None:
                step, first_env = self.guard.steps[split], split * self.envs_per_split
                self.finished_order.extend([step, self.idx, first_env + env] for env in ended.tolist())
            if self.buffers.policy_episodes is not None:  # PBT's objective per policy
                objective = (
                    self.episode_return[split, ended]
                    if objectives is None
                    else np.where(np.isnan(objectives[ended]), self.episode_return[split, ended], objectives[ended])
                )
                np.add.at(self.buffers.policy_episodes[self.idx], (self.row_policy[split, ended], 0), 1.0)
                np.add.at(self.buffers.policy_episodes[self.idx], (self.row_policy[split, ended], 1), objective)
            if self.buffers.game_results is not None:
                self._count_games(split, episode_over)
            self.episode_return[split, ended] = 0.0
            self.episode_length[split, ended] = 0

    def _count_games(self, split: int, episode_over: np.ndarray) -> None:
        """Two-player games of `split` that ended: their results, for each of their two policies (the learner rates
        them and weights the pool's snapshots by them, sf_engine.selfplay)."""
        games = np.flatnonzero(episode_over.reshape(-1, 2).all(1))
        if not len(games):
            return
        returns = self.episode_return[split].reshape(-1, 2)[games]
        policies = self.row_policy[split].reshape(-1, 2)[games].astype(np.int64)
        outcome = outcomes(returns[:, 0], returns[:, 1])
        results = self.buffers.game_results[self.idx]
        np.add.at(results, (policies[:, 0], policies[:, 1], outcome), 1.0)
        np.add.at(results, (policies[:, 1], policies[:, 0], LOSS - outcome), 1.0)

    def send_stats(self) -> None:
        """Episodes finished since the last call (the last 100 of them in full; --deterministic: every one, with
        its key) and stage times."""
        last = slice(-100, None) if self.finished_order is None else slice(None)
        self.ctx.send(
            Episodes(
                self.timer.report(self.ctx.name),
                len(self.finished_returns),
                self.finished_returns[last],
                self.finished_lengths[last],
                {name: values[-100:] for name, values in self.finished_extra.items()},
                self.finished_policies[last] if self.num_policies > 1 else [],
                self.finished_seats[last] if self.num_agents > 1 else [],
                *(() if self.finished_order is None else (self.finished_order, self.idx, min(self.guard.steps))),
            )
        )
        if self.finished_order is not None:
            self.finished_order = []
        self.finished_returns, self.finished_lengths, self.finished_extra = [], [], {}
        self.finished_policies, self.finished_seats = [], []
        self.last_stats_time = time.monotonic()

    def finish(self) -> None:
        self.send_stats()

    def close(self) -> None:
        for env in self.envs:
            env.close()
