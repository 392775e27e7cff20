"""QR-DQN (Dabney, Rowland, Bellemare and Munos 2018, "Distributional Reinforcement Learning with Quantile
Regression"): each action's return distribution as N quantiles at the midpoints tau_i = (2i + 1) / 2N, trained on
the n-step targets of the replay buffer's transitions (returns + discounts x the target network's quantiles of the
next observation's best action by mean) with the quantile Huber loss, weighted by prioritized replay's importance
weights; it acts epsilon-greedy on the quantiles' mean with Ape-X's epsilons per row. Written against sf_engine's
public API (moved here unchanged but for its imports). Runs in the learner process (QRDQN) and in every process
that acts (QuantileNetwork).
"""

from __future__ import annotations

import torch
from torch import nn

from sf_engine.algo.base import TrainResult, schedule_learning_rate
from sf_engine.algo.training_state import Holds, TrainingState
from sf_engine.model.acting import ActOutput
from sf_engine.model.features import Encoder
from sf_engine.model.flat_state import FlatAdam, flatten_state

LOSS_STATS = ("quantile_loss", "q_mean", "td_abs_mean", "grad_norm")


def quantile_huber_loss(quantiles: torch.Tensor, targets: torch.Tensor, taus: torch.Tensor, kappa: float):
    """[B] the quantile Huber loss of each sample: sum over the N quantiles theta_i [B, N] (at `taus` [N]) of the mean
    over the N' target samples [B, N'] of |tau_i - 1{u < 0}| x L_kappa(u) / kappa, u = target_j - theta_i."""
    u = targets.unsqueeze(1) - quantiles.unsqueeze(2)  # [B, N, N']
    abs_u = u.abs()
    huber = torch.where(abs_u <= kappa, 0.5 * u.square(), kappa * (abs_u - 0.5 * kappa))
    weight = (taus.view(1, -1, 1) - (u.detach() < 0).float()).abs()
    return (weight * huber / kappa).mean(dim=2).sum(dim=1)


class QuantileNetwork(nn.Module):
    """The engine's encoder (a built-in one or the user's --encoder, --layer_norm after its hidden layers), then one
    linear layer of A x N quantiles. Its acting contract (sf_engine.ActingNetwork): epsilon-greedy on the quantiles'
    mean while acting for training (--epsilon_*, --apex_alpha), greedy otherwise."""

    recurrent = False
    state_size = 0

    def __init__(self, spec, cfg, bf16: bool = False):
        super().__init__()
        self.qcfg = cfg.q
        self.encoder = Encoder(spec, cfg.model, layer_norm=cfg.q.layer_norm)
        self.num_actions, self.num_quantiles = spec.action.nvec[0], cfg.qrdqn.num_quantiles
        self.head = nn.Linear(self.encoder.out_size, self.num_actions * self.num_quantiles)

    def quantiles(self, obs: dict) -> torch.Tensor:
        """[B, A, N] each action's return quantiles."""
        return self.head(self.encoder(obs)).view(-1, self.num_actions, self.num_quantiles)

    def initial_state(self, batch: int, device="cpu"):
        return None

    def refresh_bf16_acting(self) -> None:
        pass

    def outputs(self, obs: dict, state=None):
        """(Q-values [B, A]: the quantiles' means, their maximum [B], None)."""
        q = self.quantiles(obs).mean(dim=2)
        return q, q.max(dim=1).values, None

    def act(self, obs: dict, state, ctx, forward=None):
        q, values, _ = (forward or self.outputs)(obs, state)
        greedy = q.argmax(dim=1)
        if ctx.greedy or not ctx.training:
            return ActOutput(greedy, torch.zeros_like(values), values, None)
        epsilons = self._epsilons(ctx, len(q), q.device)
        explore = torch.rand(len(q), device=q.device) < epsilons
        actions = torch.where(explore, torch.randint_like(greedy, self.num_actions), greedy)
        probability = epsilons / self.num_actions + (1.0 - epsilons) * (actions == greedy)
        return ActOutput(actions, probability.log(), values, None)

    def _epsilons(self, ctx, batch: int, device) -> torch.Tensor:
        """[B] each row's epsilon: the base epsilon decayed linearly over --epsilon_decay_env_steps, to Ape-X's
        exponent 1 + alpha i / (N - 1) of the row's index i among the run's N rows."""
        q = self.qcfg
        done = min(1.0, ctx.env_steps / max(q.epsilon_decay_env_steps, 1))
        base = q.epsilon_start + done * (q.epsilon_end - q.epsilon_start)
        if ctx.rows is None:
            return torch.full((batch,), base, device=device)
        rows = torch.as_tensor(ctx.rows, device=device).double()
        return (base ** (1.0 + q.apex_alpha * rows / max(ctx.num_rows - 1, 1))).float()


class QRDQN(TrainingState):
    """One policy's QR-DQN (sf_engine.Algorithm): the online quantile network (published), its target network (a
    copy every --target_update_period updates, or Polyak steps of --target_tau), Adam over the flat weights."""

    holds = Holds(
        modules=("model", "target"),
        optimizers={"optimizer": "optimizer"},
        counters=("num_updates",),
        follows={"target": "model"},
    )

    @staticmethod
    def acting_network(spec, cfg, bf16: bool = False) -> QuantileNetwork:
        return QuantileNetwork(spec, cfg, bf16)

    def __init__(self, cfg, spec, device, hooks):
        self.cfg, self.lcfg, self.device, self.hooks = cfg, cfg.learner, device, hooks
        self.model = QuantileNetwork(spec, cfg).to(device)
        self.params = flatten_state(self.model)
        self.target = QuantileNetwork(spec, cfg).to(device).requires_grad_(False)
        self.target_params = flatten_state(self.target)
        self.target_params.copy_(self.params)
        self.optimizer = FlatAdam(self.model, self.params, lr=self.lcfg.learning_rate, eps=self.lcfg.adam_eps)
        n = cfg.qrdqn.num_quantiles
        self.taus = (torch.arange(n, device=device, dtype=torch.float32) + 0.5) / n
        self.num_updates = 0

    @property
    def learning_rate(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def train(self, batch) -> TrainResult:
        """One optimizer step on a ReplayBatch: its TrainResult, with |TD error| [B] of the quantiles' means as the
        priorities. A step whose loss or gradient is not finite is skipped (no step, TD errors 0)."""
        if self.num_updates % 64 == 0:
            schedule_learning_rate(self.optimizer, self.cfg, self.lcfg, self.hooks)
        rows = torch.arange(len(batch.actions), device=self.device)
        with torch.no_grad():
            next_target = self.target.quantiles(batch.next_obs)  # [B, A, N]
            chooser = self.model.quantiles(batch.next_obs) if self.cfg.q.double_q else next_target
            best = chooser.mean(dim=2).argmax(dim=1)
            targets = batch.returns.unsqueeze(1) + batch.discounts.unsqueeze(1) * next_target[rows, best]
        quantiles = self.model.quantiles(batch.obs)[rows, batch.actions.reshape(-1)]  # [B, N]
        per_sample = quantile_huber_loss(quantiles, targets, self.taus, self.cfg.qrdqn.quantile_huber_kappa)
        loss = (batch.weights * per_sample).mean()
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = self.optimizer.clip_grad_norm(self.lcfg.max_grad_norm, loss.detach())
        td_abs = (targets.mean(dim=1) - quantiles.detach().mean(dim=1)).abs()
        figures = torch.stack([loss.detach(), quantiles.detach().mean(), td_abs.mean(), grad_norm.reshape(())]).cpu()
        if not torch.isfinite(figures).all():
            return TrainResult(0, {}, 0, 1, torch.zeros_like(td_abs))
        self.optimizer.step()
        self.num_updates += 1
        q = self.cfg.q
        if self.num_updates % q.target_update_period == 0 and torch.isfinite(self.params).all():
            self.target_params.lerp_(self.params, q.target_tau)
        return TrainResult(len(td_abs), dict(zip(LOSS_STATS, figures.tolist())), 1, 0, td_abs)
