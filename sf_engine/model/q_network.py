"""The Q-network of the value-based family (--algo dqn, pqn, r2d2) and how it acts: epsilon-greedy, with an
epsilon per row (Ape-X exploration), illegal actions never chosen; R2D2's value rescaling.

Runs in the policy worker (acting), the learner (training), the evaluator and enjoy.py (greedy). It offers what
the acting side asks of any model (sf_engine.algo.acting.build_policy): forward / outputs -> (Q-values as the
distribution's parameters [B, A], their legal maximum [B], with a core the new state), sample, greedy,
distribution.mode (the argmax), initial_state. With --rnn (--algo r2d2) a recurrent core sits between the encoder
and the heads, its state [B, state_size] carried by the caller as for the actor-critic. Observations as for the
actor-critic: a dict key -> [B, *shape] in their stored dtype.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from sf_engine.envs.spec import ACTION_MASK_KEY
from sf_engine.model import kernels
from sf_engine.model.acting import ActContext, ActOutput
from sf_engine.model.actor_critic import MASKED_LOGIT
from sf_engine.model.cnn import init_layer
from sf_engine.model.distributions import ActionDistribution
from sf_engine.model.features import Encoder
from sf_engine.model.kernels import mlp
from sf_engine.model.recurrent import RecurrentCore, run_sequence

RESCALE_EPS = 1e-3  # R2D2's epsilon of the value rescaling h


def value_rescale(x: torch.Tensor) -> torch.Tensor:
    """R2D2's h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x (Pohlen et al. 2018): returns to the Q-network's scale."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + RESCALE_EPS * x


def inverse_value_rescale(x: torch.Tensor) -> torch.Tensor:
    """h^-1(x) = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1): the Q-network's scale to
    returns."""
    root = (torch.sqrt(1.0 + 4.0 * RESCALE_EPS * (x.abs() + 1.0 + RESCALE_EPS)) - 1.0) / (2.0 * RESCALE_EPS)
    return torch.sign(x) * (root.square() - 1.0)


class QNetwork(nn.Module):
    """Encoder (--encoder's; a built-in one with --layer_norm has a LayerNorm after each hidden layer, each
    convolution's included), with --rnn a recurrent core, then a linear head of one Q-value per action, or with
    --dueling a value stream and an advantage stream: Q = V + A - mean(A). With --value_rescale the Q-values are
    h(returns): the values that sample and greedy report are h^-1 of them (returns), as the actor-critic reports
    denormalized values."""

    def __init__(self, spec, mcfg, qcfg, bf16: bool = False):
        """`mcfg`: a resolved ModelConfig (sf_engine.model.shape); `qcfg`: the q group (dueling, layer_norm,
        value_rescale)."""
        super().__init__()
        if spec.action.kind != "discrete":
            raise ValueError("a Q-network needs a discrete action space")
        self.bf16, self.qcfg = bf16, qcfg  # qcfg: its exploration too (act)
        self.distribution = ActionDistribution(spec.action)
        self.masked = spec.action_mask
        self.encoder = Encoder(spec, mcfg, layer_norm=qcfg.layer_norm)
        size, actions = self.encoder.out_size, self.distribution.num_params
        self.core = RecurrentCore(mcfg.rnn, size, mcfg.rnn_size) if mcfg.rnn != "none" else None
        size, self.state_size = (self.core.out_size, self.core.state_size) if self.core else (size, 0)
        self.rescaled = qcfg.value_rescale
        self.q_head = init_layer(nn.Linear(size, actions), 1.0)  # the advantage stream with --dueling
        self.value_head = init_layer(nn.Linear(size, 1), 1.0) if qcfg.dueling else None
        # one MLP over one vector observation (CartPole's), no dueling: encoder (its layer norms included) and
        # head run as one compiled MLP on the CPU (kernels.mlp), and training may skip autograd
        # (q_loss_gradients); else None
        single = self.encoder.single_mlp
        self._stack = None
        if single is not None and self.value_head is None and not bf16 and self.core is None:
            self._stack = (single[0], *single[1].with_head(self.q_head))

    @property
    def recurrent(self) -> bool:
        return self.core is not None

    def initial_state(self, batch: int, device="cpu"):
        """The state of `batch` envs at an episode's start: zeros [batch, state_size], None without a core."""
        return torch.zeros(batch, self.state_size, device=device) if self.recurrent else None

    def refresh_bf16_acting(self) -> None:
        """Acting under --bf16 runs the encoder under autocast (nothing to prepare)."""

    def _features(self, obs: dict) -> torch.Tensor:
        """The encoder's features [B, F] (float32; under bfloat16 autocast with --bf16)."""
        if not self.bf16:
            return self.encoder(obs)
        with torch.autocast(next(iter(obs.values())).device.type, dtype=torch.bfloat16):
            features = self.encoder(obs)
        return features.float()

    def _heads(self, features: torch.Tensor) -> torch.Tensor:
        """Features [..., F] -> Q-values [..., A]."""
        q = self.q_head(features)
        if self.value_head is None:
            return q
        return self.value_head(features) + q - q.mean(dim=-1, keepdim=True)

    def q_values(self, obs: dict) -> torch.Tensor:
        """Q-values [B, A] of every action, illegal ones included (float32); a model without a core."""
        if self._stack is not None:
            key, *stack = self._stack
            return mlp(self.encoder.prepare(key, obs[key]), *stack)
        return self._heads(self._features(obs))

    def q_step(self, obs: dict, state: torch.Tensor, core_step=None):
        """One step of a model with a core: (Q-values [B, A], illegal ones included, the new state [B, S]) from
        `state` [B, S] (already zeroed where an episode starts). `core_step(core, x, state)` -> (output, new
        state) replaces the core's own step (export's: through nn.GRU / nn.LSTM)."""
        features = self._features(obs)
        out, new_state = core_step(self.core, features, state) if core_step else self.core.step(features, state)
        return self._heads(out), new_state

    def q_sequence(self, obs: dict, state: torch.Tensor, episode_start: torch.Tensor):
        """Training a model with a core: the network unrolled over R steps of B sequences, as acting stepped it.
        obs: key -> [R * B, ...] time-major; state [B, S] before step 0; episode_start [R, B] bool (the state is
        zeroed before those steps). Returns (Q-values [R, B, A], illegal ones included, the core's state after
        each step [R, B, S])."""
        steps, batch = episode_start.shape
        features = self._features(obs).view(steps, batch, -1)
        states = run_sequence(self.core.kind, features, state, episode_start, self.core.weights)
        return self._heads(states[..., : self.core.out_size]), states

    def forward_sequence(self, obs: dict, state: torch.Tensor, episode_start: torch.Tensor):
        """ActorCritic.forward_sequence's call (what auto sizing times): (legal Q-values [R * B, A], their maximum
        [R * B], the core's state after each step [R, B, S])."""
        q, states = self.q_sequence(obs, state, episode_start)
        q = self.legal(q.reshape(-1, q.shape[-1]), obs)
        return q, q.max(dim=1).values, states

    def _returns(self, values: torch.Tensor) -> torch.Tensor:
        """Values in the Q-network's scale -> in returns (h^-1 with --value_rescale)."""
        return inverse_value_rescale(values) if self.rescaled else values

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
        key, *stack = self._stack
        x = self.encoder.prepare(key, obs[key])
        outputs = kernels.mlp_outputs(x, *stack)
        stats, grad = loss_and_grad(outputs[-1])
        kernels.mlp_backward_into(grad, x, outputs, *stack)
        return stats

    def legal(self, q: torch.Tensor, obs: dict) -> torch.Tensor:
        """`q` with illegal actions at MASKED_LOGIT where the env gives an action mask (a row with no legal
        action keeps all): no argmax, greedy or bootstrapping, ever picks one."""
        if not self.masked:
            return q
        illegal = obs[ACTION_MASK_KEY].reshape(q.shape) == 0
        return q.masked_fill(illegal & ~illegal.all(dim=1, keepdim=True), MASKED_LOGIT)

    def forward(self, obs: dict, state=None):
        """(legal Q-values [B, A], their maximum [B]): the distribution's parameters and the value (in the
        network's scale); with a core also the new state (`state` [B, S], already zeroed where an episode starts)."""
        if not self.recurrent:
            q = self.legal(self.q_values(obs), obs)
            return q, q.max(dim=1).values
        q, new_state = self.q_step(obs, state)
        q = self.legal(q, obs)
        return q, q.max(dim=1).values, new_state

    def outputs(self, obs: dict, state=None):
        """(legal Q-values, their maximum, the new state or None without a core)."""
        return self(obs, state) if self.recurrent else (*self(obs), None)

    def greedy(self, obs: dict, state=None, core_step=None):
        """(the greedy action [B], its value [B] in returns), with a core also the new state: export's function
        (`core_step` as in q_step)."""
        if not self.recurrent:
            q, values = self(obs)
            return self.distribution.mode(q), self._returns(values)
        q, new_state = self.q_step(obs, state, core_step)
        q = self.legal(q, obs)
        return self.distribution.mode(q), self._returns(q.max(dim=1).values), new_state

    def sample(self, obs: dict, state=None, epsilons: torch.Tensor | None = None, forward=None):
        """Acting: (actions [B] int64, log-probabilities of the actions under the epsilon-greedy policy [B],
        the greedy values [B] in returns, the new state or None). Row b explores with probability epsilons[b]
        (a legal action uniformly at random), else takes the greedy one; `epsilons` None: greedy everywhere.
        `forward`: what runs `outputs` (--compile's graphed.BucketedForward), None: outputs itself."""
        q, values, new_state = (forward or self.outputs)(obs, state)
        values = self._returns(values)
        greedy = q.argmax(dim=1)
        if epsilons is None:
            return greedy, torch.zeros_like(values), values, new_state
        legal = q > MASKED_LOGIT / 2  # [B, A]: every action where no mask says otherwise
        scores = torch.rand(q.shape, device=q.device).masked_fill_(~legal, -1.0)  # a uniform legal action
        explore = torch.rand(q.shape[0], device=q.device) < epsilons
        actions = torch.where(explore, scores.argmax(dim=1), greedy)
        probability = epsilons / legal.sum(dim=1) + (1.0 - epsilons) * (actions == greedy)
        return actions, probability.log(), values, new_state

    def act(self, obs: dict, state, ctx: ActContext, forward=None) -> ActOutput:
        """The acting contract (sf_engine.model.acting): epsilon-greedy while acting for training, each row with
        Ape-X's epsilon of the schedule's base epsilon at `ctx.env_steps` (--epsilon_*, --apex_alpha); greedy
        otherwise (a Q-network's policy is its argmax)."""
        epsilons = None
        if ctx.training and not ctx.greedy:
            first = next(iter(obs.values()))
            base = base_epsilon(self.qcfg, ctx.env_steps)
            epsilons = row_epsilons(base, ctx, self.qcfg.apex_alpha, first.shape[0], first.device)
        return ActOutput(*self.sample(obs, state, epsilons, forward))


def epsilon_exponents(rows: int, apex_alpha: float, index=None):
    """Ape-X's exponents 1 + alpha * i / (rows - 1) of the rows `index` (an array or a float tensor; None: [rows]
    float64 of every row), row i of `rows` acting with base ** exponent."""
    index = np.arange(rows) if index is None else index
    return 1.0 + apex_alpha * index / max(rows - 1, 1)


def row_epsilons(base: float, ctx: ActContext, apex_alpha: float, batch: int, device) -> torch.Tensor:
    """[B] float32 each row's epsilon, Ape-X's: base ** epsilon_exponents' of row i of the run's N (`ctx.rows`,
    `ctx.num_rows`); `base` for every row where the site has no rows."""
    if ctx.rows is None:
        return torch.full((batch,), base, dtype=torch.float32, device=device)
    if isinstance(ctx.rows, torch.Tensor):  # a device sampler's rows, where they act: no copy from the host
        return base ** epsilon_exponents(ctx.num_rows, apex_alpha, ctx.rows.float())
    exponents = epsilon_exponents(ctx.num_rows, apex_alpha, np.asarray(ctx.rows, np.float64))
    return torch.from_numpy((base**exponents).astype(np.float32)).to(device)


def base_epsilon(qcfg, env_steps: int) -> float:
    """The schedule's base epsilon after `env_steps` env steps of the run: --epsilon_start decayed linearly
    to --epsilon_end over --epsilon_decay_env_steps."""
    done = min(1.0, env_steps / max(qcfg.epsilon_decay_env_steps, 1))
    return qcfg.epsilon_start + done * (qcfg.epsilon_end - qcfg.epsilon_start)
