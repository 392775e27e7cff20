"""The Q-network of the value-based family (--algo dqn, --algo pqn) and how it acts: epsilon-greedy, with an
epsilon per row (Ape-X exploration), illegal actions never chosen.

Runs in the policy worker (acting), the learner (training), the evaluator and enjoy.py (greedy). It offers what
the acting side asks of any model (build_policy below): forward / outputs -> (Q-values as the
distribution's parameters [B, A], their legal maximum [B]), sample, distribution.mode (the argmax), no recurrent
core. Observations as for the actor-critic: a dict key -> [B, *shape] in their stored dtype.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from sf_engine.envs.spec import ACTION_MASK_KEY
from sf_engine.model import kernels
from sf_engine.model.actor_critic import MASKED_LOGIT, ActorCritic, Encoder
from sf_engine.model.cnn import init_layer
from sf_engine.model.distributions import ActionDistribution
from sf_engine.model.kernels import mlp


class QNetwork(nn.Module):
    """Encoder (MLP or CNN, with --layer_norm a LayerNorm after each hidden layer), then a linear head of one
    Q-value per action, or with --dueling a value stream and an advantage stream: Q = V + A - mean(A)."""

    recurrent = False
    state_size = 0

    def __init__(self, spec, mcfg, qcfg, bf16: bool = False):
        """`mcfg`: a resolved ModelConfig (sf_engine.model.shape); `qcfg`: the q group (dueling, layer_norm)."""
        super().__init__()
        if spec.action.kind != "discrete":
            raise ValueError("a Q-network needs a discrete action space")
        self.bf16 = bf16
        self.distribution = ActionDistribution(spec.action)
        self.masked = spec.action_mask
        self.encoder = Encoder(spec, mcfg, layer_norm=qcfg.layer_norm)
        size, actions = self.encoder.out_size, self.distribution.num_params
        self.q_head = init_layer(nn.Linear(size, actions), 1.0)  # the advantage stream with --dueling
        self.value_head = init_layer(nn.Linear(size, 1), 1.0) if qcfg.dueling else None
        # one MLP over one vector observation (CartPole's), no dueling: encoder and head run as one compiled
        # MLP on the CPU (kernels.mlp), and training may skip autograd (q_loss_gradients); else None
        single = self.encoder.single_mlp
        self._stack = None
        if single is not None and self.value_head is None and not bf16:
            self._stack = (single[0], single[1].linears + [self.q_head], single[1].activations + ("identity",))

    def initial_state(self, batch: int, device="cpu"):
        return None

    def refresh_bf16_acting(self) -> None:
        """Acting under --bf16 runs the encoder under autocast (nothing to prepare)."""

    def q_values(self, obs: dict) -> torch.Tensor:
        """Q-values [B, A] of every action, illegal ones included (float32)."""
        if self._stack is not None:
            key, linears, activations = self._stack
            return mlp(self.encoder.prepare(key, obs[key]), linears, activations)
        if self.bf16:
            with torch.autocast(next(iter(obs.values())).device.type, dtype=torch.bfloat16):
                features = self.encoder(obs)
            features = features.float()
        else:
            features = self.encoder(obs)
        q = self.q_head(features)
        if self.value_head is None:
            return q
        return self.value_head(features) + q - q.mean(dim=1, keepdim=True)

    def direct_gradients(self, obs: dict) -> bool:
        """Whether q_loss_gradients runs for `obs`: one MLP stack (see _stack) on the compiled CPU kernels."""
        return self._stack is not None and kernels.use_kernels(
            self.encoder.prepare(self._stack[0], obs[self._stack[0]])
        )

    def q_loss_gradients(self, obs: dict, loss_and_grad):
        """A training step's forward and backward without autograd, where direct_gradients(obs): the stack's
        compiled forward, loss_and_grad(Q-values [B, A]) -> (stats, d loss / d Q-values [B, A]), and the
        compiled backward adding into each parameter's .grad (autograd's gradients: tests/test_dqn.py).
        Returns the stats."""
        key, linears, activations = self._stack
        x = self.encoder.prepare(key, obs[key])
        outputs = kernels.mlp_outputs(x, linears, activations)
        stats, grad = loss_and_grad(outputs[-1])
        kernels.mlp_backward_into(grad, x, outputs, linears, activations)
        return stats

    def legal(self, q: torch.Tensor, obs: dict) -> torch.Tensor:
        """`q` with illegal actions at MASKED_LOGIT where the env gives an action mask (a row with no legal
        action keeps all): no argmax, greedy or bootstrapping, ever picks one."""
        if not self.masked:
            return q
        illegal = obs[ACTION_MASK_KEY].reshape(q.shape) == 0
        return q.masked_fill(illegal & ~illegal.all(dim=1, keepdim=True), MASKED_LOGIT)

    def forward(self, obs: dict, state=None):
        """(legal Q-values [B, A], their maximum [B]): the distribution's parameters and the value."""
        q = self.legal(self.q_values(obs), obs)
        return q, q.max(dim=1).values

    def outputs(self, obs: dict, state=None):
        return (*self(obs), None)

    def sample(self, obs: dict, state=None, epsilons: torch.Tensor | None = None):
        """Acting: (actions [B] int64, log-probabilities of the actions under the epsilon-greedy policy [B],
        the greedy Q-values [B], None). Row b explores with probability epsilons[b] (a legal action uniformly
        at random), else takes the greedy one; `epsilons` None: greedy everywhere."""
        q, values = self(obs)
        greedy = q.argmax(dim=1)
        if epsilons is None:
            return greedy, torch.zeros_like(values), values, None
        legal = q > MASKED_LOGIT / 2  # [B, A]: every action where no mask says otherwise
        scores = torch.rand(q.shape, device=q.device).masked_fill_(~legal, -1.0)  # a uniform legal action
        explore = torch.rand(q.shape[0], device=q.device) < epsilons
        actions = torch.where(explore, scores.argmax(dim=1), greedy)
        probability = epsilons / legal.sum(dim=1) + (1.0 - epsilons) * (actions == greedy)
        return actions, probability.log(), values, None


def epsilon_exponents(rows: int, apex_alpha: float) -> np.ndarray:
    """[rows] float64: Ape-X's exponents 1 + alpha * i / (rows - 1), row i acting with base ** exponent."""
    return 1.0 + apex_alpha * np.arange(rows) / max(rows - 1, 1)


def base_epsilon(qcfg, env_steps: int) -> float:
    """The schedule's base epsilon after `env_steps` env steps of the run: --epsilon_start decayed linearly
    to --epsilon_end over --epsilon_decay_env_steps."""
    done = min(1.0, env_steps / max(qcfg.epsilon_decay_env_steps, 1))
    return qcfg.epsilon_start + done * (qcfg.epsilon_end - qcfg.epsilon_start)


def build_policy(spec, cfg, bf16: bool = False) -> nn.Module:
    """The acting model of a run of `cfg` (a resolved Config): the Q-network of the value-based algorithms,
    else the actor-critic. Every acting site (policy worker, evaluator, enjoy.py, export) builds it here."""
    if cfg.acts_on_q:
        return QNetwork(spec, cfg.model, cfg.q, bf16)
    return ActorCritic(spec, cfg.model, bf16)
