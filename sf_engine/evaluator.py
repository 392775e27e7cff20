"""Evaluator: periodic greedy evaluation on its own envs, and the `best` checkpoint.

Runs in the evaluator process (or the runner in serial mode) on the CPU, only with --eval_every_sec.
Every period it copies the newest weights from the learner's shared tensor (same seqlock as the
policy worker), plays --eval_episodes whole episodes with the most likely actions, one per env of
its own batch (never the rollout workers' envs), reports them, and writes checkpoints/best.pt when
the mean return beats every earlier evaluation.
"""
from __future__ import annotations

import logging
import os
import sys
import time

import numpy as np
import torch

from envs import make_batch_env, register_env
from sf_engine.checkpoint import BEST_NAME, CheckpointError, load_checkpoint, save_state_atomic
from sf_engine.ipc import Empty, ParentWatch, init_child, report_fault, stat
from sf_engine.model import ActorCritic, act, flatten_state, obs_tensors
from sf_engine.policy_worker import read_shared_params
from sf_engine.shared_buffers import SharedBuffers

EVAL_SEED_OFFSET = 1_000_000_007


def play_episodes(model: ActorCritic, env, max_steps: int, deterministic: bool = True, should_stop=lambda: False):
    """One whole episode per env of `env` (a BatchEnv). Returns (returns [E], lengths [E], finished [E])
    of the true score; stops counting an env once its first episode is over. Gives up (finished False)
    after `max_steps` steps or when `should_stop()`."""
    obs = env.reset()
    returns, lengths = np.zeros(env.num_envs), np.zeros(env.num_envs, np.int64)
    running = np.ones(env.num_envs, bool)
    state = model.initial_state(env.num_envs)  # one episode per env: no resets
    with torch.inference_mode():
        for _ in range(max_steps):
            if should_stop():
                break
            actions, state = act(model, obs_tensors(obs), state, deterministic)
            result = env.step(actions.numpy())
            returns += result.score_rewards * running
            lengths += running
            running &= ~result.episode_over
            obs = result.obs
            if not running.any():
                break
    return returns, lengths, ~running


class Evaluator:
    def __init__(self, cfg, buffers: SharedBuffers, queues, spec, checkpoint_dir: str):
        self.cfg, self.buffers, self.queues, self.checkpoint_dir = cfg, buffers, queues, checkpoint_dir
        self.model = ActorCritic(spec, cfg.model)
        self.model.requires_grad_(False)
        self.params = flatten_state(self.model)
        self.env = make_batch_env(cfg.env.env, cfg.env.env_backend, cfg.run.eval_episodes,
                                  seed=cfg.env.seed + EVAL_SEED_OFFSET, spec=spec, training=False)
        self.shared_params = None
        self.next_eval_time = time.monotonic() + cfg.run.eval_every_sec
        self.best_path = os.path.join(checkpoint_dir, BEST_NAME)
        self.best_return = self._previous_best()

    def _previous_best(self) -> float:
        """A resumed run keeps the best evaluation of the runs before it."""
        if not os.path.exists(self.best_path):
            return -np.inf
        try:
            return float(load_checkpoint(self.best_path)["eval_return"])
        except CheckpointError as exc:  # an unreadable best checkpoint is replaced by the next evaluation
            logging.warning("ignoring %s", exc)
            return -np.inf

    def step(self, timeout_sec: float) -> None:
        """Evaluate when the period is over; otherwise wait at most `timeout_sec`."""
        self.buffers.beat("evaluator")
        if self.shared_params is None:
            try:
                self.shared_params = self.queues.eval_params.get(timeout=max(timeout_sec, 1e-3))
            except Empty:
                return
        wait = self.next_eval_time - time.monotonic()
        if wait > 0:
            time.sleep(min(wait, timeout_sec))
            return
        try:
            self.evaluate()
        except Exception:  # evaluation must never stop training
            logging.exception("evaluation failed; training goes on")
        self.next_eval_time = time.monotonic() + self.cfg.run.eval_every_sec

    def evaluate(self):
        """Mean return of the finished episodes (None if none finished); best.pt only when all did."""
        start = time.monotonic()
        version = read_shared_params(self.buffers.param_seq, self.shared_params, self.params)
        returns, lengths, finished = play_episodes(self.model, self.env, self.cfg.run.eval_max_steps,
                                                   should_stop=self._should_stop)
        if not finished.any():
            logging.info("evaluation of version %d: no episode finished within --eval_max_steps", version)
            return None
        mean = float(returns[finished].mean())
        if finished.all() and mean > self.best_return:
            self.best_return = mean
            try:
                save_state_atomic(self.best_path, {"model": self.model.state_dict(), "version": version,
                                                   "eval_return": mean, "config": self.cfg.to_dict()})
            except OSError as exc:
                logging.warning("best.pt not written (%s); the previous one is kept", exc.strerror or exc)
        stat(self.queues, "eval", version=version, return_mean=mean, return_std=float(returns[finished].std()),
             length_mean=float(lengths[finished].mean()), episodes=int(finished.sum()),
             unfinished=int((~finished).sum()), best=self.best_return, seconds=time.monotonic() - start)
        return mean

    def _should_stop(self) -> bool:
        self.buffers.beat("evaluator")  # an evaluation may take long: it is still alive
        return bool(self.buffers.stop[0])

    def close(self) -> None:
        self.env.close()


def run_evaluator(cfg, shm_path: str, layout: dict, queues, spec, log_path: str, checkpoint_dir: str,
                  registered_envs: dict) -> None:
    """Process target of the evaluator."""
    init_child("evaluator", 0, log_path)
    torch.set_num_threads(1)
    for name, make_env in registered_envs.items():
        register_env(name, make_env)
    buffers = SharedBuffers.attach(shm_path, layout)
    buffers.beat("evaluator")
    watch = ParentWatch(queues.lifeline)
    try:
        evaluator = Evaluator(cfg, buffers, queues, spec, checkpoint_dir)
        while not buffers.stop[0] and watch.parent_alive():
            evaluator.step(timeout_sec=0.2)
        evaluator.close()
    except Exception:
        report_fault(queues, "evaluator", 0)
        sys.exit(1)
