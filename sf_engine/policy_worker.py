"""Policy worker: batches every pending inference request into one forward pass.

Runs in the policy-worker process (or the runner in serial mode) on the run's device. Per request
(worker, token, slot, row) it reads obs[key][slot, row] [E, *shape] from shared memory and writes
actions [E, *action_shape], log_probs, values and policy_version [E] at [slot, row]; then it sends the
token back to the worker.
Weights come from the learner's shared copy whenever its version moves (seqlock: never half-written).
"""
from __future__ import annotations

import logging
import sys
import time
from collections import defaultdict

import numpy as np
import torch

from sf_engine.device import resolve_device
from sf_engine.ipc import Empty, ParentWatch, get_many, init_child, report_fault, stat
from sf_engine.model import ActorCritic, flatten_state
from sf_engine.shared_buffers import SharedBuffers

STATS_EVERY_SEC = 1.0


WEIGHT_READ_TIMEOUT_SEC = 30.0


def read_shared_params(param_seq: np.ndarray, shared: torch.Tensor, local: torch.Tensor) -> int:
    """Copy the learner's weights into `local` without ever keeping a half-written set; returns the
    version copied. The learner makes param_seq odd while it writes and even (2 x version) after.
    On CUDA the copy is awaited before the sequence is checked again (copy_ only queues it)."""
    deadline = time.monotonic() + WEIGHT_READ_TIMEOUT_SEC
    while time.monotonic() < deadline:
        before = int(param_seq[0])
        if before % 2:
            time.sleep(0)
            continue
        local.copy_(shared)
        if local.is_cuda:
            torch.cuda.current_stream(local.device).synchronize()
        if int(param_seq[0]) == before:
            return before // 2
    raise TimeoutError(f"the learner's weights stayed mid-write for {WEIGHT_READ_TIMEOUT_SEC:g} s")


class PolicyWorker:
    def __init__(self, cfg, buffers: SharedBuffers, queues, spec):
        self.buffers, self.queues = buffers, queues
        self.device = resolve_device(cfg.run.device)
        self.envs_per_split, self.num_splits = cfg.sampler.envs_per_split, cfg.sampler.worker_num_splits
        self.rollout = cfg.sampler.rollout
        self.model = ActorCritic(spec, cfg.model).to(self.device)
        self.model.requires_grad_(False)
        self.params = flatten_state(self.model)
        self.shared_params = None
        self.version = -1
        self.stage_sec = {"wait_requests": 0.0, "gather": 0.0, "forward": 0.0, "write_results": 0.0,
                          "weight_reload": 0.0}
        self.first_step_time = None  # stage seconds add up to the wall time since then
        self.num_forwards, self.num_samples = 0, 0
        self.last_stats_time = time.monotonic()

    def step(self, timeout_sec: float) -> None:
        """One batched forward over all waiting requests (blocks at most `timeout_sec` for one)."""
        start = time.monotonic()
        if self.first_step_time is None:
            self.first_step_time = start
        self.buffers.beat("policy_worker")
        if self.shared_params is None:
            try:
                self.shared_params = self.queues.params.get(timeout=max(timeout_sec, 1e-3))
            except Empty:
                return
            finally:
                self.stage_sec["wait_requests"] += time.monotonic() - start
            start = time.monotonic()
        requests = get_many(self.queues.policy_requests, timeout_sec)
        self.stage_sec["wait_requests"] += time.monotonic() - start
        if requests:
            self._maybe_reload()
            self._serve(requests)
        if time.monotonic() - self.last_stats_time > STATS_EVERY_SEC:
            self.send_stats()

    def _maybe_reload(self) -> None:
        if int(self.buffers.param_seq[0]) // 2 != self.version:
            start = time.monotonic()
            self.version = read_shared_params(self.buffers.param_seq, self.shared_params, self.params)
            self.stage_sec["weight_reload"] += time.monotonic() - start

    def _serve(self, requests: list) -> None:
        start = time.monotonic()
        buf, n = self.buffers, len(requests)
        # one fancy-indexed read and one write per array, whatever the number of requests
        slots = np.fromiter((r[2] for r in requests), np.int64, n)
        rows = np.fromiter((r[3] for r in requests), np.int64, n)
        obs = {}
        for key, array in buf.obs.items():
            batch = array[slots[0], rows[0]] if n == 1 else array[slots, rows].reshape(-1, *array.shape[3:])
            obs[key] = torch.from_numpy(batch).to(self.device)
        state = None
        if self.model.recurrent:  # each env's carried state, zeroed where its episode starts
            workers = np.fromiter((r[0] for r in requests), np.int64, n)
            splits = np.fromiter((r[1] for r in requests), np.int64, n) % self.num_splits
            carried = buf.rnn_current[workers, splits]
            carried[buf.episode_start[slots, rows]] = 0.0
            buf.rnn_states[slots, rows] = carried
            state = torch.from_numpy(carried.reshape(n * self.envs_per_split, -1)).to(self.device)
        gathered = time.monotonic()
        with torch.inference_mode():
            actions, log_probs, values, new_state = self.model.sample(obs, state)
            actions, log_probs, values = actions.cpu().numpy(), log_probs.cpu().numpy(), values.cpu().numpy()
        computed = time.monotonic()
        if new_state is not None:
            new_state = new_state.cpu().numpy().reshape(carried.shape)
            buf.rnn_current[workers, splits] = new_state
            last = rows == self.rollout - 1  # the state the bootstrap row would be acted from
            if last.any():
                buf.rnn_states[slots[last], self.rollout] = new_state[last]
        per_request = (n, self.envs_per_split)
        buf.actions[slots, rows] = actions.reshape(*per_request, *actions.shape[1:])
        buf.log_probs[slots, rows] = log_probs.reshape(per_request)
        buf.values[slots, rows] = values.reshape(per_request)
        buf.policy_version[slots, rows] = self.version
        replies = defaultdict(list)
        for worker, token, _, _ in requests:
            replies[worker].append(token)
        for worker, tokens in replies.items():
            self.queues.actions_ready[worker].send(tokens)
        self.num_forwards += 1
        self.num_samples += len(actions)
        self.stage_sec["gather"] += gathered - start
        self.stage_sec["forward"] += computed - gathered
        self.stage_sec["write_results"] += time.monotonic() - computed

    def send_stats(self) -> None:
        stat(self.queues, "inference", forwards=self.num_forwards, samples=self.num_samples,
             stage_sec=dict(self.stage_sec), wall_sec=time.monotonic() - (self.first_step_time or time.monotonic()))
        self.num_forwards = self.num_samples = 0
        self.last_stats_time = time.monotonic()


def run_policy_worker(cfg, shm_path: str, layout: dict, queues, spec, log_path: str) -> None:
    """Process target of the policy worker."""
    init_child("policy_worker", 0, log_path)
    torch.set_num_threads(1)
    buffers = SharedBuffers.attach(shm_path, layout)
    buffers.beat("policy_worker")
    watch = ParentWatch(queues.lifeline)
    try:
        worker = PolicyWorker(cfg, buffers, queues, spec)
        logging.info("ready: model built on %s", worker.device)
        while not buffers.stop[0] and watch.parent_alive():
            worker.step(timeout_sec=0.1)
    except Exception:
        report_fault(queues, "policy_worker", 0)
        sys.exit(1)
