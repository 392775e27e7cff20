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
import time

import numpy as np
import torch

from envs import make_batch_env, register_env
from sf_engine.checkpoint import BEST_NAME, save_state_atomic
from sf_engine.ipc import Empty, ParentWatch, init_child, stat
from sf_engine.model import ActorCritic, flatten_state
from sf_engine.policy_worker import read_shared_params
from sf_engine.shared_buffers import SharedBuffers

EVAL_SEED_OFFSET = 1_000_000_007


def play_episodes(model: ActorCritic, env, max_steps: int, deterministic: bool = True):
    """One whole episode per env of `env` (a BatchEnv). Returns (returns [E], lengths [E]) of the
    true score; stops counting an env once its first episode is over."""
    obs = env.reset()
    returns, lengths = np.zeros(env.num_envs), np.zeros(env.num_envs, np.int64)
    running = np.ones(env.num_envs, bool)
    with torch.inference_mode():
        for _ in range(max_steps):
            tensors = {key: torch.from_numpy(np.asarray(value)) for key, value in obs.items()}
            params, _ = model(tensors)
            actions = model.distribution.mode(params) if deterministic else model.sample(tensors)[0]
            result = env.step(actions.numpy())
            returns += result.score_rewards * running
            lengths += running
            running &= ~result.episode_over
            obs = result.obs
            if not running.any():
                break
    return returns, lengths


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
        self.best_return = -np.inf

    def step(self, timeout_sec: float) -> None:
        """Evaluate when the period is over; otherwise wait at most `timeout_sec`."""
        if self.shared_params is None:
            try:
                self.shared_params = self.queues.eval_params.get(timeout=max(timeout_sec, 1e-3))
            except Empty:
                return
        wait = self.next_eval_time - time.monotonic()
        if wait > 0:
            time.sleep(min(wait, timeout_sec))
            return
        self.evaluate()
        self.next_eval_time = time.monotonic() + self.cfg.run.eval_every_sec

    def evaluate(self) -> float:
        start = time.monotonic()
        version = read_shared_params(self.buffers.param_seq, self.shared_params, self.params)
        returns, lengths = play_episodes(self.model, self.env, self.cfg.run.eval_max_steps)
        mean = float(returns.mean())
        if mean > self.best_return:
            self.best_return = mean
            save_state_atomic(os.path.join(self.checkpoint_dir, BEST_NAME), {
                "model": self.model.state_dict(), "version": version, "eval_return": mean,
                "config": self.cfg.to_dict()})
        stat(self.queues, "eval", version=version, return_mean=mean,
             return_std=float(returns.std()), length_mean=float(lengths.mean()), best=self.best_return,
             seconds=time.monotonic() - start)
        return mean

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
    watch = ParentWatch()
    try:
        evaluator = Evaluator(cfg, buffers, queues, spec, checkpoint_dir)
        while not buffers.stop[0] and watch.parent_alive():
            evaluator.step(timeout_sec=0.2)
        evaluator.close()
    except Exception:
        logging.exception("evaluator failed")
        raise
