"""Rollout worker: owns num_envs_per_worker envs in worker_num_splits groups and fills trajectory slots.

Runs in a rollout-worker process (one CPU core, no torch), or in the runner in serial mode. While one
split waits for its actions from the policy worker, the worker steps the other (double buffering).
A split's cycle: write obs at [slot, row] -> request actions -> step envs with actions[slot, row] ->
write rewards/dones at row and obs at row + 1 -> ... -> at row == rollout hand the slot to the learner
and take a free one.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from envs import make_batch_env, register_env
from sf_engine.ipc import ParentWatch, get_many, init_child, stat
from sf_engine.shared_buffers import SharedBuffers

STATS_EVERY_SEC = 0.5


class RolloutWorker:
    def __init__(self, cfg, worker_idx: int, buffers: SharedBuffers, queues, spec):
        self.idx, self.buffers, self.queues = worker_idx, buffers, queues
        self.rollout, self.num_splits = cfg.sampler.rollout, cfg.sampler.worker_num_splits
        self.envs_per_split = cfg.sampler.envs_per_split
        # env i of a batch gets seed + i: batches are spaced by their size so no two envs share a seed
        first_seed = cfg.env.seed * 1_000_003 + worker_idx * cfg.sampler.num_envs_per_worker
        self.envs = [make_batch_env(cfg.env.env, cfg.env.env_backend, self.envs_per_split,
                                    seed=first_seed + split * self.envs_per_split, spec=spec)
                     for split in range(self.num_splits)]
        self.slot = [-1] * self.num_splits
        self.row = [0] * self.num_splits
        # a split between two slots keeps its current obs here until a free slot arrives
        self.pending_obs: list = [None] * self.num_splits
        self.pending_valid: list = [None] * self.num_splits
        self.waiting_for_slot: list[int] = []
        self.num_awaiting_actions = 0
        self.episode_return = np.zeros((self.num_splits, self.envs_per_split), np.float64)
        self.episode_length = np.zeros((self.num_splits, self.envs_per_split), np.int64)
        self.finished_returns: list = []
        self.finished_lengths: list = []
        self.stage_sec = {"env_step": 0.0, "write_slot": 0.0, "wait_actions": 0.0, "wait_slot": 0.0}
        self.last_stats_time = time.monotonic()
        self.first_step_time = None  # stage seconds add up to the wall time since then

    def start(self) -> None:
        """Reset every env and queue each split for a free slot."""
        for split, env in enumerate(self.envs):
            self.pending_obs[split] = {key: np.array(value) for key, value in env.reset().items()}
            self.pending_valid[split] = np.ones(self.envs_per_split, bool)
            self.waiting_for_slot.append(split)
        self._take_free_slots(timeout_sec=0)

    def step(self, timeout_sec: float) -> None:
        """One unit of work: take free slots for waiting splits, then advance every split whose actions
        are ready. Blocks at most `timeout_sec` (0 in serial mode)."""
        if self.first_step_time is None:
            self.first_step_time = time.monotonic()
        if self.waiting_for_slot:
            start = time.monotonic()
            self._take_free_slots(timeout_sec if self.num_awaiting_actions == 0 else 0)
            self.stage_sec["wait_slot"] += time.monotonic() - start
        if self.num_awaiting_actions:
            start = time.monotonic()
            ready = get_many(self.queues.actions_ready[self.idx], timeout_sec)
            self.stage_sec["wait_actions"] += time.monotonic() - start
            for split in ready:
                self.num_awaiting_actions -= 1
                self._advance(split)
        if time.monotonic() - self.last_stats_time > STATS_EVERY_SEC:
            self.send_stats()

    def _take_free_slots(self, timeout_sec: float) -> None:
        for slot in get_many(self.queues.free_slots, timeout_sec, max_messages=len(self.waiting_for_slot)):
            split = self.waiting_for_slot.pop(0)
            self.slot[split], self.row[split] = slot, 0
            for key, value in self.pending_obs[split].items():
                self.buffers.obs[key][slot, 0] = value
            self.buffers.valid[slot, 0] = self.pending_valid[split]
            self._request_actions(split)

    def _request_actions(self, split: int) -> None:
        self.num_awaiting_actions += 1
        self.queues.policy_requests.put((self.idx, split, self.slot[split], self.row[split]))

    def _advance(self, split: int) -> None:
        """Step split's envs with the actions the policy worker wrote, record the transition."""
        buf, slot, row = self.buffers, self.slot[split], self.row[split]
        start = time.monotonic()
        result = self.envs[split].step(buf.actions[slot, row])
        stepped = time.monotonic()
        self.stage_sec["env_step"] += stepped - start
        self._record(split, slot, row, result)
        self.stage_sec["write_slot"] += time.monotonic() - stepped

    def _record(self, split: int, slot: int, row: int, result) -> None:
        """Write the transition into the slot; request the next actions or hand the full slot over."""
        buf = self.buffers
        buf.rewards[slot, row] = result.rewards
        buf.terminated[slot, row] = result.terminated
        buf.truncated[slot, row] = result.truncated
        done = np.logical_or(result.terminated, result.truncated)
        self._track_episodes(split, result.score_rewards, result.episode_over, buf.valid[slot, row])
        buf.env_steps[self.idx] += self.envs_per_split
        row += 1
        for key, value in result.obs.items():
            buf.obs[key][slot, row] = value
        if row < self.rollout:
            buf.valid[slot, row] = ~done  # the step after an episode end is the env's reset step
            self.row[split] = row
            self._request_actions(split)
            return
        self.queues.full_slots.put(slot)
        self.slot[split] = -1
        self.pending_obs[split] = {key: np.array(value) for key, value in result.obs.items()}
        self.pending_valid[split] = ~done
        self.waiting_for_slot.append(split)
        self._take_free_slots(timeout_sec=0)

    def _track_episodes(self, split: int, score_rewards, episode_over, valid) -> None:
        """Returns of whole episodes as the user scores them (true game score on Atari)."""
        self.episode_return[split] += score_rewards * valid
        self.episode_length[split] += valid
        if episode_over.any():
            ended = np.flatnonzero(episode_over)
            self.finished_returns.extend(self.episode_return[split, ended].tolist())
            self.finished_lengths.extend(self.episode_length[split, ended].tolist())
            self.episode_return[split, ended] = 0.0
            self.episode_length[split, ended] = 0

    def send_stats(self) -> None:
        """Episodes finished since the last call (the last 100 of them in full) and stage times."""
        stat(self.queues, "episodes", worker=self.idx, count=len(self.finished_returns),
             returns=self.finished_returns[-100:], lengths=self.finished_lengths[-100:],
             stage_sec=dict(self.stage_sec), wall_sec=time.monotonic() - (self.first_step_time or time.monotonic()))
        self.finished_returns, self.finished_lengths = [], []
        self.last_stats_time = time.monotonic()

    def close(self) -> None:
        for env in self.envs:
            env.close()


def run_rollout_worker(cfg, worker_idx: int, shm_path: str, layout: dict, queues, spec, log_path: str,
                       registered_envs: dict) -> None:
    """Process target of rollout worker `worker_idx`; `registered_envs` are the runner's register_env()s."""
    init_child("rollout_worker", worker_idx, log_path)
    for name, make_env in registered_envs.items():
        register_env(name, make_env)
    buffers = SharedBuffers.attach(shm_path, layout)
    watch = ParentWatch()
    worker = RolloutWorker(cfg, worker_idx, buffers, queues, spec)
    worker.start()
    logging.info("ready: %d envs reset", cfg.sampler.num_envs_per_worker)
    try:
        while not buffers.stop[0] and watch.parent_alive():
            worker.step(timeout_sec=0.1)
        worker.send_stats()
    except Exception:
        logging.exception("rollout worker %d failed", worker_idx)
        raise
    finally:
        worker.close()
