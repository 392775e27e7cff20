"""Policy worker: batches every pending inference request into one forward pass.

Runs in the policy-worker process (or the runner in serial mode) on the run's device. Per request
(worker, token, slot, row) it reads obs[key][slot, row] [E, *shape] from shared memory and writes
actions [E, *action_shape], log_probs, values and policy_version [E] at [slot, row]; then it sends the
token back to the worker.
Weights come from the learner's shared copy whenever its version moves (weights.SharedWeights). How the rows act,
their exploration included, is the acting network's (its `act`, sf_engine.model.acting): the worker says what it
knows (the run's env steps, the version in force, each row's index among the run's env rows).
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import torch

from sf_engine.algo.acting import build_policy
from sf_engine.algo.base import keep_beating
from sf_engine.config.parallel import device_of
from sf_engine.model.acting import ActContext
from sf_engine.model.flat_state import flatten_state
from sf_engine.model.graphed import BucketedForward, bucket_sizes
from sf_engine.runtime.ipc import get_many
from sf_engine.runtime.transfer import PinnedRows, to_device, torch_dtype
from sf_engine.runtime.wiring import InferenceRequest, policy_worker_of
from sf_engine.stats.messages import Inference
from sf_engine.stats.stages import InferenceStage, StageTimer

STATS_EVERY_SEC = 1.0


class PolicyWorker:
    def __init__(self, ctx):
        cfg = ctx.cfg
        self.ctx, self.buffers, self.queues = ctx, ctx.buffers, ctx.queues
        self.device = torch.device(device_of(cfg.run.device, ctx.index))  # --num_policy_workers: worker k on GPU k
        if self.device.type == "cuda":  # its GPU for whatever is made on "cuda" (CUDA graphs' capture included)
            torch.cuda.set_device(self.device)
        self.envs_per_split, self.num_splits = cfg.sampler.envs_per_split, cfg.sampler.worker_num_splits
        self.rollout = cfg.sampler.rollout
        self.num_acting = cfg.policies.num_acting  # the trained policies, then the opponent pool's snapshots
        self.models = [build_policy(ctx.plan.spec, cfg, cfg.run.bf16).to(self.device) for _ in range(self.num_acting)]
        self.env_steps_base = ctx.plan.env_steps_base
        most_requests = max(cfg.sampler.total_splits, 1)  # one per split at a time
        # each env row's index among the run's N acting rows: row i = (worker, split, env) in that order
        self.num_rows, self.envs = most_requests * self.envs_per_split, np.arange(self.envs_per_split)
        for model in self.models:
            model.requires_grad_(False)
        self.params = [flatten_state(model) for model in self.models]
        self.gather = PinnedRows(self.device, most_requests)
        self.forwards = [None] * self.num_acting  # --compile: each model's BucketedForward
        if cfg.run.compile:
            sizes = bucket_sizes(self.envs_per_split, most_requests)
            self.forwards = [self._bucketed(model, sizes) for model in self.models]
        self.weights = [ctx.weights(policy) for policy in range(self.num_acting)]
        self.versions = np.full(self.num_acting, -1, np.int64)
        self.timer = StageTimer(*InferenceStage)
        self.num_forwards, self.num_samples = 0, 0
        self.policy_sec: dict = defaultdict(float)  # several policies: policy -> seconds of its forwards
        self.last_stats_time = time.monotonic()
        # --deterministic in --mode sync: a forward waits for one request of every split and takes them in the order
        # of (worker, split), so that its batch, its random draws and the epsilons' env steps follow no clock
        self.round: list | None = [] if cfg.run.deterministic and cfg.run.mode == "sync" else None
        self.round_size = cfg.sampler.total_splits

    def _bucketed(self, model, sizes: list) -> BucketedForward:
        """--compile: `model`'s acting forward captured (CUDA graphs) or compiled at `sizes` rows, now."""
        example = {
            key: torch.zeros((1, *a.shape[3:]), dtype=torch_dtype(a.dtype), device=self.device)
            for key, a in self.buffers.obs.items()
        }
        model.refresh_bf16_acting()  # --bf16: the bfloat16 copies the graphs will read, made before capture
        forward = BucketedForward(
            model.outputs, example, model.state_size if model.recurrent else 0, sizes, self.device
        )
        with torch.inference_mode(), keep_beating(self.ctx.beat):  # compiling may outlast --stuck_timeout_sec
            forward.warm_up()
        return forward

    @property
    def model(self):
        return self.models[0]

    def describe(self) -> str:
        cfg = self.ctx.cfg
        served = [w for w in range(cfg.sampler.num_workers) if policy_worker_of(w, cfg) == self.ctx.index]
        share = "" if cfg.parallel.num_policy_workers == 1 else f", serving rollout worker(s) {served}"
        return f"{self.num_acting} model(s) built on {self.device}{share}"

    def step(self, timeout_sec: float) -> None:
        """One batched forward over all waiting requests (blocks at most `timeout_sec` for one)."""
        self.timer.start()
        self.ctx.beat()
        connected = all(weights.connect("policy_worker", timeout_sec) for weights in self.weights)
        self.timer.lap(InferenceStage.WAIT_REQUESTS)
        if not connected:
            return
        requests = get_many(self.queues.policy_requests[self.ctx.index], timeout_sec)
        if self.round is not None:
            requests = self._whole_round(requests)
        self.timer.lap(InferenceStage.WAIT_REQUESTS)
        if requests:
            for policy, weights in enumerate(self.weights):
                if weights.version != self.versions[policy]:
                    version = weights.read_into(self.params[policy])  # None: the learner is being replaced
                    if version is not None:
                        self.versions[policy] = version
                        self.models[policy].refresh_bf16_acting()
                    self.timer.lap(InferenceStage.WEIGHT_RELOAD)
            self._serve(requests)
        if time.monotonic() - self.last_stats_time > STATS_EVERY_SEC:
            self.send_stats()

    def _whole_round(self, requests: list) -> list:
        """--deterministic in --mode sync: no request until every split has made one (all of them wait for their
        actions then: the env steps are those of the same step every time), then all of them in a fixed order."""
        self.round += requests
        if len(self.round) < self.round_size:
            return []
        requests, self.round = sorted(self.round), []
        return requests

    def finish(self) -> None:
        self.send_stats()

    def close(self) -> None:
        pass

    def _serve(self, requests: list) -> None:
        """Actions for every InferenceRequest of `requests`, written into their slots; each worker told."""
        buf, n = self.buffers, len(requests)
        # one fancy-indexed read and one write per array, whatever the number of requests
        # each request is an InferenceRequest's fields (worker, token, slot, row), sent as a plain tuple
        workers, tokens, slots, rows = np.array(requests, np.int64).reshape(n, len(InferenceRequest._fields)).T
        obs = {key: self.gather.gather(key, array, slots, rows) for key, array in buf.obs.items()}
        state = None
        if self.model.recurrent:  # each env's carried state, zeroed where its episode starts
            splits = tokens % self.num_splits
            carried = buf.rnn_current[workers, splits]
            carried[buf.episode_start[slots, rows]] = 0.0
            buf.rnn_states[slots, rows] = carried
            state = to_device(carried.reshape(n * self.envs_per_split, -1), self.device)
        self.timer.lap(InferenceStage.GATHER)
        policies = None if buf.policy_id is None else buf.policy_id[slots, rows].reshape(-1)
        acting_rows = self._rows(workers * self.num_splits + tokens % self.num_splits)
        actions, log_probs, values, new_state = self._forward(obs, state, policies, acting_rows)
        self.timer.lap(InferenceStage.FORWARD)
        if new_state is not None:
            new_state = new_state.reshape(carried.shape)
            buf.rnn_current[workers, splits] = new_state
            last = rows == self.rollout - 1  # the state the bootstrap row would be acted from
            if last.any():
                buf.rnn_states[slots[last], self.rollout] = new_state[last]
        per_request = (n, self.envs_per_split)
        buf.actions[slots, rows] = actions.reshape(*per_request, *actions.shape[1:])
        buf.log_probs[slots, rows] = log_probs.reshape(per_request)
        buf.values[slots, rows] = values.reshape(per_request)
        buf.policy_version[slots, rows] = (
            self.versions[0] if policies is None else self.versions[policies].reshape(per_request)
        )
        replies = defaultdict(list)
        for worker, token in zip(workers.tolist(), tokens.tolist()):
            replies[worker].append(token)
        for worker, tokens in replies.items():
            self.queues.actions_ready[worker].send(tokens)
        self.num_forwards += 1
        self.num_samples += len(actions)
        self.timer.lap(InferenceStage.WRITE_RESULTS)

    def _rows(self, splits: np.ndarray) -> np.ndarray:
        """[requests x E] the index among the run's acting rows of each env of the requests of `splits` (each
        request's split among the run's)."""
        return (splits[:, None] * self.envs_per_split + self.envs).reshape(-1)

    def _context(self, policy: int, rows: np.ndarray) -> ActContext:
        """What this worker knows of the rows `rows` (their indices among the run's acting rows) acted by `policy`."""
        env_steps = self.env_steps_base + int(self.buffers.env_steps.sum())
        version = int(self.versions[policy])
        return ActContext(training=True, env_steps=env_steps, version=version, rows=rows, num_rows=self.num_rows)

    def _forward(self, obs: dict, state, policies, rows: np.ndarray):
        """(actions, log-probs, values, new state or None) of the rows, as numpy; each row acted by its
        policy (`policies` [rows], None: policy 0 for all): one forward per policy present, each its network's `act`
        (`rows`: each row's index among the run's acting rows)."""
        with torch.inference_mode():
            present = [0] if policies is None else np.unique(policies)
            if len(present) == 1:
                started = time.perf_counter()
                policy = int(present[0])
                model, forward = self.models[policy], self.forwards[policy]
                out = model.act(obs, state, self._context(policy, rows), forward)
                out = tuple(None if x is None else x.cpu().numpy() for x in out)
                if policies is not None:
                    policy = int(present[0])
                    self.policy_sec[policy] += time.perf_counter() - started
                return out
            results = None
            for policy in present:
                started = time.perf_counter()
                selected = np.flatnonzero(policies == policy)
                index = torch.from_numpy(selected).to(self.device)
                out = self.models[int(policy)].act(
                    {k: v.index_select(0, index) for k, v in obs.items()},
                    None if state is None else state.index_select(0, index),
                    self._context(int(policy), rows[selected]),
                    self.forwards[int(policy)],
                )
                out = [None if x is None else x.cpu().numpy() for x in out]
                if results is None:
                    results = [None if x is None else np.empty((len(policies),) + x.shape[1:], x.dtype) for x in out]
                for result, part in zip(results, out):
                    if result is not None:
                        result[selected] = part
                self.policy_sec[int(policy)] += time.perf_counter() - started
            return tuple(results)

    def send_stats(self) -> None:
        self.ctx.send(
            Inference(self.timer.report(self.ctx.name), self.num_forwards, self.num_samples, dict(self.policy_sec))
        )
        self.num_forwards = self.num_samples = 0
        self.policy_sec.clear()
        self.last_stats_time = time.monotonic()
