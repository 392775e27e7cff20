"""R2D2 (--algo r2d2; Kapturowski et al. 2019, "Recurrent Experience Replay in Distributed Reinforcement
Learning"): the DQN family with a recurrent core (--rnn), trained on fixed-length sequences replayed from the
recurrent state stored when they were acted. Runs in the learner process; the learner's replay source
(sf_engine.roles.replay_source) samples the sequences (sf_engine.replay.sequences), and `train` takes one
optimizer step on a batch of them.

Each sequence's window is unrolled by the online and the target network from its stored state, the state zeroed
where an episode starts (as the policy worker zeroed it when acting): first the --burn_in rows, without gradient,
which only warm up the state, then the sequence's L steps and the n-step targets' next rows. The targets are
n-step double-Q targets under value rescaling (--value_rescale): y = h(R_n + gamma^n h^-1(Q_target(s_{t+n},
argmax_a Q_online(s_{t+n}, a)))); the loss is DQN's Huber loss (--huber_delta) over the trainable steps, averaged
per sequence and weighted by its importance weight; a sequence's priority mixes its TD errors, eta max + (1 - eta)
mean (--priority_eta). The target network is DQN's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sf_engine.algo.base import TrainResult
from sf_engine.algo.batch import SequenceBatch
from sf_engine.algo.dqn.learning import DQN
from sf_engine.algo.value_targets import double_q_targets, sequence_priorities
from sf_engine.envs.spec import ACTION_MASK_KEY
from sf_engine.model.q_network import QNetwork, inverse_value_rescale, value_rescale


def _rows(obs: dict, begin: int, end: int | None) -> dict:
    """obs key -> [W, B, ...] time-major -> its rows [begin, end) as [R * B, ...] (the network's input)."""
    return {key: value[begin:end].reshape(-1, *value.shape[2:]) for key, value in obs.items()}


class R2D2(DQN):
    """One policy's R2D2 (sf_engine.algo.base.Algorithm with `replay` and `sequences`: the learner samples
    sequences and trains it by `update`)."""

    def __init__(self, cfg, spec, device, hooks):
        super().__init__(cfg, spec, device, hooks)
        if not self.model.recurrent:
            raise ValueError("R2D2 needs a recurrent core (--rnn gru or lstm)")
        self.eta = cfg.replay.priority_eta

    def train(self, batch: SequenceBatch) -> TrainResult:
        """One optimizer step on `batch`: its TrainResult, with the sequences' priorities [B]. A step whose loss or
        gradient is not finite is skipped (TrainResult.skipped_updates 1, priorities 0)."""
        if self.num_updates % 64 == 0:
            self.scheduled_learning_rate()
        length, sequences = batch.actions.shape
        trainable = batch.trainable
        counts = trainable.sum(dim=0).clamp(min=1)  # [B] trainable steps of each sequence
        steps = counts.sum()
        priorities = torch.zeros(sequences, device=batch.weights.device)

        def gradients():
            online = self._unroll(self.model, batch)
            targets = self.targets(batch, online.detach())
            q = online[:length].gather(2, batch.actions.unsqueeze(-1)).squeeze(-1)  # [L, B]
            huber = F.huber_loss(q, targets, reduction="none", delta=self.qcfg.huber_delta) * trainable
            loss = (batch.weights * huber.sum(dim=0) / counts).mean()
            loss.backward()
            td_abs = (q.detach() - targets).abs()
            priorities.copy_(sequence_priorities(td_abs, trainable, self.eta))
            q_mean = (q.detach() * trainable).sum() / steps
            return torch.stack([loss.detach(), q_mean, (td_abs * trainable).sum() / steps])

        figures = self.optimizer_step(gradients)
        if figures is None:
            return TrainResult(0, {}, 0, 1, torch.zeros_like(priorities))
        return self.step_taken(figures, length * sequences, priorities)

    def _unroll(self, net: QNetwork, batch: SequenceBatch) -> torch.Tensor:
        """Q-values [W - burn_in, B, A] of `net` over the window's rows after the burn-in, from the stored state;
        the burn-in only warms up the state, without gradient."""
        state, burn_in = batch.initial_state, batch.burn_in
        if burn_in:
            with torch.no_grad():
                _, states = net.q_sequence(_rows(batch.obs, 0, burn_in), state, batch.episode_start[:burn_in])
            state = states[-1]
        q, _ = net.q_sequence(_rows(batch.obs, burn_in, None), state, batch.episode_start[burn_in:])
        return q

    @torch.no_grad()
    def targets(self, batch: SequenceBatch, online: torch.Tensor | None = None) -> torch.Tensor:
        """[L, B] the n-step double-Q targets of the sequences' steps, value-rescaled with --value_rescale.
        `online`: the online network's Q-values over the rows after the burn-in (_unroll), None: computed here."""
        online = self._unroll(self.model, batch) if online is None else online
        target = self._unroll(self.target, batch)
        length, sequences = batch.actions.shape
        actions = online.shape[-1]
        next_rows = torch.arange(length, device=online.device).unsqueeze(1) + batch.steps  # [L, B], after burn-in
        index = next_rows.unsqueeze(-1).expand(-1, -1, actions)

        def at_next(values):  # [R, B, A] -> the next observations' [L * B, A]
            return values.gather(0, index).reshape(length * sequences, actions)

        legal = None
        if self.model.masked:
            legal = at_next(batch.obs[ACTION_MASK_KEY][batch.burn_in :].to(torch.int64)) != 0
        rescale, inverse = (value_rescale, inverse_value_rescale) if self.qcfg.value_rescale else (_same, _same)
        targets = double_q_targets(
            batch.returns.reshape(-1),
            batch.discounts.reshape(-1),
            inverse(at_next(online)),
            inverse(at_next(target)),
            legal,
            self.qcfg.double_q,
        )
        return rescale(targets).view(length, sequences)


def _same(values: torch.Tensor) -> torch.Tensor:
    return values
