"""PQN (--algo pqn; Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning"): Q(lambda) targets
over each batch of trajectory slots from the network being trained (no replay, no target network), layer
normalization in the network (--layer_norm, on by default), epochs of minibatches on the squared error.
Runs in the learner process, on the same seam as PPO (sf_engine.algo.base.Algorithm.train).

Shapes: T = rollout, N = trajectories in the batch; obs key -> [T+1, N, *shape] (row T bootstraps).
"""

from __future__ import annotations

import torch

from sf_engine.algo.base import TrainResult
from sf_engine.algo.batch import TrajectoryBatch
from sf_engine.algo.q_learning import QLearning
from sf_engine.algo.value_targets import q_lambda_returns

LOSS_STATS = ("q_loss", "q_mean")  # then grad_norm


class PQN(QLearning):
    """One policy's PQN (sf_engine.algo.base.Algorithm)."""

    replay = False

    def train(self, batch: TrajectoryBatch) -> TrainResult:
        """Q(lambda) targets of the whole batch, then --num_epochs passes of --num_batches_per_epoch
        minibatches over the samples `batch.keep` [T, N] marks."""
        self.scheduled_learning_rate()
        steps, envs = batch.rewards.shape
        flat_obs = {key: obs.reshape(-1, *obs.shape[2:]) for key, obs in batch.obs.items()}  # [(T+1) N, ...]
        with torch.no_grad():
            next_max_q = self.model(flat_obs)[1].reshape(steps + 1, envs)[1:]  # legal maximum of rows 1..T
        targets = q_lambda_returns(
            batch.rewards,
            next_max_q,
            batch.terminated,
            batch.dones,
            batch.valid,
            self.lcfg.gamma,
            self.cfg.q.q_lambda,
        )
        picked = batch.keep.reshape(-1).nonzero().squeeze(1)
        obs = {key: value[: steps * envs].index_select(0, picked) for key, value in flat_obs.items()}
        actions = batch.actions.reshape(steps * envs, -1)[:, 0].index_select(0, picked)
        targets = targets.reshape(-1).index_select(0, picked)
        return self._epochs(obs, actions, targets)

    def _epochs(self, obs: dict, actions: torch.Tensor, targets: torch.Tensor) -> TrainResult:
        """With several learner ranks (the optimizer averages over them) every rank takes part in each of the
        --num_batches_per_epoch steps, whatever its share holds (none: a zero gradient), so the ranks take the same
        steps."""
        samples = len(targets)
        totals, updates, skipped = torch.zeros(len(LOSS_STATS) + 1), 0, 0
        ranked = self.optimizer.average is not None
        minibatches = (
            self.lcfg.num_batches_per_epoch if ranked else max(1, min(self.lcfg.num_batches_per_epoch, samples // 2))
        )
        for _ in range(self.lcfg.num_epochs):
            for rows in torch.randperm(samples, device=self.device).tensor_split(minibatches):
                if self.hooks.stopping() or not (len(rows) or ranked):
                    continue
                self.hooks.beat()
                figures = self.optimizer_step(
                    lambda: (
                        self._gradients(
                            {k: v.index_select(0, rows) for k, v in obs.items()},
                            actions.index_select(0, rows),
                            targets.index_select(0, rows),
                        )
                        if len(rows)
                        else torch.zeros(len(LOSS_STATS), device=self.device)
                    )
                )
                if figures is None:
                    skipped += 1
                    continue
                totals += figures
                updates += 1
        losses = {name: float(v) / updates for name, v in zip(LOSS_STATS + ("grad_norm",), totals)} if updates else {}
        return TrainResult(samples, losses, updates, skipped)

    def _gradients(self, obs: dict, actions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The squared error's gradients into the optimizer's; returns [loss, mean Q]."""
        q = self.model.q_values(obs).gather(1, actions.reshape(-1, 1)).squeeze(1)
        loss = 0.5 * (q - targets).square().mean()
        loss.backward()
        return torch.stack([loss.detach(), q.detach().mean()])
