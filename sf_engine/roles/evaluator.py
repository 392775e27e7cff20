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

from sf_engine.algo.acting import build_policy
from sf_engine.envs import make_batch_env
from sf_engine.model.flat_state import flatten_state
from sf_engine.play.episodes import play
from sf_engine.runtime.checkpoint import BEST_NAME, CheckpointError, load_checkpoint, save_state_atomic
from sf_engine.stats.messages import Evaluation

EVAL_SEED_OFFSET = 1_000_000_007


class Evaluator:
    def __init__(self, ctx):
        cfg = ctx.cfg
        self.ctx, self.cfg = ctx, cfg
        self.model = build_policy(ctx.plan.spec, cfg)
        self.model.requires_grad_(False)
        self.params = flatten_state(self.model)
        self.weights = ctx.weights()
        self.two_player = len(ctx.plan.spec.agents) == 2  # evaluated by games against a random player
        agents = ctx.plan.spec.num_agents  # a multi-agent env: whole games, one episode per agent
        rows = 2 * min(cfg.run.eval_episodes, 32) if self.two_player else -(-cfg.run.eval_episodes // agents) * agents
        self.env = make_batch_env(
            cfg.env.env,
            cfg.env.env_backend,
            rows,
            seed=cfg.env.seed + EVAL_SEED_OFFSET,
            spec=ctx.plan.spec,
            training=False,
        )
        self.next_eval_time = time.monotonic() + cfg.run.eval_every_sec
        self.best_path = os.path.join(ctx.plan.paths.checkpoint_dir, BEST_NAME)
        self.best_return = self._previous_best()

    def describe(self) -> str:
        what = "games against a random player" if self.two_player else "evaluation envs"
        return f"{self.cfg.run.eval_episodes} {what} every {self.cfg.run.eval_every_sec:g} s"

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
        self.ctx.beat()
        if not self.weights.connect("evaluator", timeout_sec):
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
        """One greedy episode per evaluation env: the mean return of the finished ones (None if none
        finished); best.pt only when all did."""
        start = time.monotonic()
        version = self.weights.read_into(self.params)
        if version is None:  # the learner is being replaced: the next period evaluates its weights
            return None
        if self.two_player:
            return self._evaluate_games(version, start)
        returns, lengths = {}, {}
        for env_index, episode_return, length in play(
            self.model, self.env, 1, max_steps=self.cfg.run.eval_max_steps, should_stop=self._should_stop
        ):
            returns[env_index], lengths[env_index] = episode_return, length
        if not returns:
            logging.info("evaluation of version %d: no episode finished within --eval_max_steps", version)
            return None
        finished = np.array(list(returns.values()))
        mean = float(finished.mean())
        if len(returns) == self.env.num_envs:
            self._keep_best(mean, version)
        self.ctx.send(
            Evaluation(
                version,
                mean,
                float(finished.std()),
                float(np.mean(list(lengths.values()))),
                len(returns),
                self.env.num_envs - len(returns),
                self.best_return,
                time.monotonic() - start,
            )
        )
        return mean

    def _evaluate_games(self, version: int, start: float) -> float:
        """Two-player games: --eval_episodes games against a random player, both seats; the mean return
        (Connect Four: wins minus losses) decides best.pt."""
        from sf_engine.play.matches import make_opponent, play_matches

        figures = play_matches(
            self.model,
            self.env,
            make_opponent("random", self.ctx.plan.spec, seed=version),
            self.cfg.run.eval_episodes,
            max_steps=self.cfg.run.eval_max_steps,
            should_stop=self._should_stop,
        )
        if not figures.games:
            return None
        mean = figures.return_mean
        if figures.games == self.cfg.run.eval_episodes:
            self._keep_best(mean, version)
        self.ctx.send(
            Evaluation(
                version,
                mean,
                figures.return_std,
                figures.length_mean,
                figures.games,
                self.cfg.run.eval_episodes - figures.games,
                self.best_return,
                time.monotonic() - start,
                figures.win_rate,
                figures.draw_rate,
                figures.loss_rate,
            )
        )
        return mean

    def _keep_best(self, mean: float, version: int) -> None:
        """best.pt when `mean` beats every earlier evaluation."""
        if mean <= self.best_return:
            return
        self.best_return = mean
        try:
            save_state_atomic(
                self.best_path,
                {
                    "model": self.model.state_dict(),
                    "version": version,
                    "eval_return": mean,
                    "config": self.cfg.to_dict(),
                },
            )
        except OSError as exc:
            logging.warning("best.pt not written (%s); the previous one is kept", exc.strerror or exc)

    def _should_stop(self) -> bool:
        self.ctx.beat()  # an evaluation may take long: it is still alive
        return self.ctx.stopping

    def finish(self) -> None:
        pass

    def close(self) -> None:
        self.env.close()
