"""The actor-critic: its encoders (sf_engine.model.features), recurrent cores, heads and action distribution; and
PolicyValueModel, what every acting site and PPO's learner call on it, which a user's whole network
(sf_engine.model.user_model) implements too.

Runs in the policy worker (inference), the learner (training), the evaluator, enjoy.py and export (greedy).
Observations arrive as a dict key -> [B, *shape] in their stored dtype (uint8 images are converted and scaled
by the encoder, on the device). Outputs: distribution parameters [B, P] (logits, or Gaussian means) and values [B].
"""

from __future__ import annotations

import torch
from torch import nn

from sf_engine.envs.spec import ACTION_MASK_KEY
from sf_engine.model import kernels
from sf_engine.model.acting import ActContext, ActOutput
from sf_engine.model.cnn import init_layer as _init
from sf_engine.model.distributions import ActionDistribution
from sf_engine.model.features import Encoder, RunningMeanStd
from sf_engine.model.kernels import mlp
from sf_engine.model.recurrent import RecurrentCore
from sf_engine.model.user_model import user_model

MASKED_LOGIT = -1e9  # an illegal action's logit: probability 0 in float32, its log-probability still finite


class PolicyValueModel(nn.Module):
    """What the policy worker, the learner, the evaluator, enjoy.py, load_policy and export call on a network of
    distribution parameters [B, P] and normalized values [B]: a subclass sets `distribution` (ActionDistribution),
    `masked` (whether obs holds the action mask), `log_std` (a Gaussian's learned log-std, else None),
    `return_normalizer` (RunningMeanStd, or None) and `input_encoder` (the Encoder that prepares and normalizes the
    observations), and implements forward(obs) -> (params, values). Feed-forward here; ActorCritic adds its cores
    and fast paths."""

    recurrent = False
    state_size = 0

    def initial_state(self, batch: int, device="cpu"):
        """The state of `batch` envs at an episode's start: zeros [batch, state_size], None without a core."""
        return torch.zeros(batch, self.state_size, device=device) if self.recurrent else None

    def refresh_bf16_acting(self) -> None:
        """--bf16 acting: nothing to prepare (ActorCritic's bfloat16 copies)."""

    def greedy(self, obs: dict):
        """(the most likely action [B] or [B, K] (a Gaussian's mean [B, A], unclipped), its denormalized value [B]):
        export's function."""
        params, values = self(obs)
        return self.distribution.mode(params), self.denormalize_values(values)

    def legal(self, params: torch.Tensor, obs: dict) -> torch.Tensor:
        """`params` with the logits of illegal actions at MASKED_LOGIT where the env gives an action mask
        (obs[ACTION_MASK_KEY], 0 = illegal): they are never sampled, and the log-probs and entropies
        cover the legal actions only. A (sub-)action with no legal value at all is left unmasked: a
        categorical of only -1e9 logits has no meaning, and float32 cannot normalize it."""
        if not self.masked:
            return params
        illegal = obs[ACTION_MASK_KEY].reshape(params.shape) == 0
        none_legal = torch.cat(
            [part.all(-1, keepdim=True).expand_as(part) for part in illegal.split(self.distribution.nvec, dim=-1)],
            dim=-1,
        )
        return params.masked_fill(illegal & ~none_legal, MASKED_LOGIT)

    def direct_gradients(self, obs: dict) -> bool:
        """Whether loss_gradients (a training step without autograd) runs for `obs`: ActorCritic's CPU kernels."""
        return False

    def plus_auxiliary_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The learner's minibatch `loss` plus the auxiliary loss of the last forward with gradients (a user's
        network's third output), taken once; `loss` itself without one."""
        return loss

    def values(self, obs: dict) -> torch.Tensor:
        """Normalized values [B] (feed-forward models)."""
        return self(obs)[1]

    def denormalize_values(self, values: torch.Tensor) -> torch.Tensor:
        rn = self.return_normalizer
        return values if rn is None else values * torch.sqrt(rn.var + 1e-8) + rn.mean

    def normalize_returns(self, returns: torch.Tensor) -> torch.Tensor:
        rn = self.return_normalizer
        return returns if rn is None else (returns - rn.mean) / torch.sqrt(rn.var + 1e-8)

    def update_normalizers(self, obs: dict, returns: torch.Tensor) -> None:
        """Learner only: merge a batch's observation and return statistics (valid samples only)."""
        self.input_encoder.update_normalizers(obs)
        if self.return_normalizer is not None:
            self.return_normalizer.update(returns)

    def outputs(self, obs: dict, state=None):
        """(params, normalized values, new state): forward's outputs with or without a core (the new
        state is None without one)."""
        return self.forward(obs, state) if self.recurrent else (*self.forward(obs), None)

    def sample(self, obs: dict, state=None, forward=None):
        """Acting: actions, log-probs [B], (denormalized) values [B] and the new state (None without
        a core; `state` [B, state_size] already zeroed where an episode starts). `forward`: what runs
        `outputs` (--compile's graphed.BucketedForward), None: outputs itself."""
        params, values, new_state = (forward or self.outputs)(obs, state)
        actions, log_probs = self.distribution.sample(params, self.log_std)
        return actions, log_probs, self.denormalize_values(values), new_state

    def act(self, obs: dict, state, ctx: ActContext, forward=None) -> ActOutput:
        """The acting contract (sf_engine.model.acting): samples of the policy's distribution, or with `ctx.greedy`
        its most likely actions (log-probs zeros); the values denormalized."""
        if not ctx.greedy:
            return ActOutput(*self.sample(obs, state, forward))
        params, values, new_state = (forward or self.outputs)(obs, state)
        values = self.denormalize_values(values)
        return ActOutput(self.distribution.mode(params), torch.zeros_like(values), values, new_state)

    def log_prob_entropy(self, params, actions):
        return self.distribution.log_prob_entropy(params, actions, self.log_std)


class ActorCritic(PolicyValueModel):
    """Policy and value function; `actor_critic` 'shared' (one encoder) or 'separate' (two); with
    --rnn a recurrent core after each encoder, whose state [B, state_size] the caller carries."""

    def __init__(self, spec, mcfg, bf16: bool = False):
        """`mcfg`: a ModelConfig resolved by sf_engine.model.shape.resolve_model_config (no 'auto'). `bf16`: the
        encoders run under bfloat16 autocast (--bf16); the cores, heads and losses stay float32."""
        super().__init__()
        self.bf16 = bf16
        if "auto" in (mcfg.encoder, mcfg.actor_critic, mcfg.rnn_size):
            raise ValueError("ActorCritic needs a resolved ModelConfig: see sf_engine.model.shape")
        self.distribution = ActionDistribution(spec.action)
        self.masked = spec.action_mask  # obs[ACTION_MASK_KEY] says which actions are legal (see legal())
        self.actor_encoder = Encoder(spec, mcfg)
        self.critic_encoder = Encoder(spec, mcfg) if mcfg.actor_critic == "separate" else None
        size = self.actor_encoder.out_size
        self.actor_core = self.critic_core = None
        if mcfg.rnn != "none":
            self.actor_core = RecurrentCore(mcfg.rnn, size, mcfg.rnn_size)
            if self.critic_encoder is not None:
                self.critic_core = RecurrentCore(mcfg.rnn, size, mcfg.rnn_size)
            size = self.actor_core.out_size
        self.state_size = sum(core.state_size for core in (self.actor_core, self.critic_core) if core is not None)
        self.policy_head = _init(nn.Linear(size, self.distribution.num_params), 0.01)
        self.value_head = _init(nn.Linear(size, 1), 1.0)
        if mcfg.weight_init == "unit":  # Sample Factory's: orthogonal with gain 1 everywhere, heads included
            encoders = [e for e in (self.actor_encoder, self.critic_encoder) if e is not None and e.user is not None]
            users = {id(module) for encoder in encoders for module in encoder.user.modules()}
            for layer in self.modules():  # a user's module keeps its own init
                if isinstance(layer, (nn.Linear, nn.Conv2d)) and id(layer) not in users:
                    _init(layer, 1.0)
        self.log_std = nn.Parameter(torch.zeros(self.distribution.num_std)) if self.distribution.num_std else None
        self.return_normalizer = RunningMeanStd(()) if mcfg.normalize_returns else None
        # plain lists (not submodules: not in the state dict), see refresh_bf16_acting
        self._bf16_acting, self._bf16_sources, self._bf16_version = None, [], 0
        # separate MLP encoders over one vector observation (CartPole's): each encoder and its head
        # run as one MLP (one compiled call on the CPU, see kernels.mlp); else None
        self._stacks = None
        if not self.recurrent and self.critic_encoder is not None and self.actor_encoder.single_mlp:
            self._stacks = tuple(
                (encoder, *encoder.single_mlp[1].with_head(head))
                for encoder, head in ((self.actor_encoder, self.policy_head), (self.critic_encoder, self.value_head))
            )

    @property
    def recurrent(self) -> bool:
        return self.actor_core is not None

    @property
    def input_encoder(self):
        return self.actor_encoder

    def refresh_bf16_acting(self) -> None:
        """--bf16 acting (the policy worker, after each weight reload): bfloat16 copies of the image
        networks' and the cores' weights, which forward() without gradients then runs in bfloat16
        without autocast (which casts every weight again on every call: a tenth of a Doom forward);
        the cores' state stays float32 between steps. Models without images (or with a user's encoder)
        act under autocast. Once made, a forward that finds the weights changed in place since (a load, an
        optimizer step) refreshes the copies first."""
        if self.bf16 and self.actor_encoder.bf16_copies:
            encoders = [e for e in (self.actor_encoder, self.critic_encoder) if e is not None]
            cores = [c for c in (self.actor_core, self.critic_core) if c is not None]
            nets, weights = self._bf16_acting or ([None] * len(encoders), [None] * len(cores))
            self._bf16_acting = (
                [encoder.bfloat16_nets(copies) for encoder, copies in zip(encoders, nets)],
                [core.bfloat16_weights(copies) for core, copies in zip(cores, weights)],
            )
            self._bf16_sources = [p for e in encoders for key in e.image_keys for p in e.nets[key].parameters()] + [
                w for core in cores for w in core.weights
            ]
            self._bf16_version = sum(p._version for p in self._bf16_sources)

    def _acting_bf16(self):
        """(encoder networks, core weights) in bfloat16 when acting under --bf16 (see refresh_bf16_acting)."""
        if self._bf16_acting is None or torch.is_grad_enabled():
            return None
        if sum(p._version for p in self._bf16_sources) != self._bf16_version:  # changed since: no stale copy
            self.refresh_bf16_acting()
        return self._bf16_acting

    def _features(self, obs: dict, acting=None):
        """(actor features, critic features); `acting`: _acting_bf16()'s bfloat16 copies, or None."""
        if acting is not None:
            features = self.actor_encoder(obs, acting[0][0])
            critic = features if self.critic_encoder is None else self.critic_encoder(obs, acting[0][1])
            return features.float(), critic.float()
        if not self.bf16:
            features = self.actor_encoder(obs)
            return features, (features if self.critic_encoder is None else self.critic_encoder(obs))
        with torch.autocast(next(iter(obs.values())).device.type, dtype=torch.bfloat16):
            features = self.actor_encoder(obs)
            critic = features if self.critic_encoder is None else self.critic_encoder(obs)
        return features.float(), critic.float()

    def _cores(self, features, critic_features, state, acting=None, core_step=None):
        """One step of the core(s): (actor out, critic out, new state); `acting` as in _features; `core_step(core,
        x, state)` -> (output, new state) replaces the cores' own step (export's: through nn.GRU / nn.LSTM)."""
        actor_weights, critic_weights = (acting[1] + [None])[:2] if acting is not None else (None, None)

        def step(core, x, core_state, weights):
            return core_step(core, x, core_state) if core_step else core.step(x, core_state, weights)

        if self.critic_core is None:
            out, new_state = step(self.actor_core, features, state, actor_weights)
            return out, out, new_state
        actor_state, critic_state = state.split(self.actor_core.state_size, dim=-1)
        out, new_actor = step(self.actor_core, features, actor_state, actor_weights)
        critic_out, new_critic = step(self.critic_core, critic_features, critic_state, critic_weights)
        return out, critic_out, torch.cat([new_actor, new_critic], dim=-1)

    def forward(self, obs: dict, state=None):
        """Distribution parameters [B, P] and normalized values [B]; with a core also the new state
        (`state`: [B, state_size], already zeroed where an episode starts)."""
        if self._stacks is not None and not self.bf16:
            params, values = (
                mlp(encoder.prepare(encoder.keys[0], obs[encoder.keys[0]]), *stack) for encoder, *stack in self._stacks
            )
            return self.legal(params, obs), values.squeeze(-1)
        acting = self._acting_bf16()
        features, critic_features = self._features(obs, acting)
        if not self.recurrent:
            return self.legal(self.policy_head(features), obs), self.value_head(critic_features).squeeze(-1)
        out, critic_out, new_state = self._cores(features, critic_features, state, acting)
        return self.legal(self.policy_head(out), obs), self.value_head(critic_out).squeeze(-1), new_state

    def greedy(self, obs: dict, state=None, core_step=None):
        """(the most likely action [B] or [B, K] (a Gaussian's mean [B, A], unclipped), its denormalized value [B]),
        with a core also the new state (`state` [B, state_size]): export's function (`core_step` as in _cores)."""
        features, critic_features = self._features(obs)
        out, critic_out, new_state = features, critic_features, None
        if self.recurrent:
            out, critic_out, new_state = self._cores(features, critic_features, state, core_step=core_step)
        action = self.distribution.mode(self.legal(self.policy_head(out), obs))
        value = self.denormalize_values(self.value_head(critic_out).squeeze(-1))
        return (action, value) if new_state is None else (action, value, new_state)

    def forward_sequence(self, obs: dict, state: torch.Tensor, episode_start: torch.Tensor):
        """The core re-run over sequences, as the policy worker ran it step by step. obs: key ->
        [R * B, ...] time-major; state [B, state_size] before the first step; episode_start [R, B] (the
        state is zeroed before those steps). Returns params [R * B, P], normalized values [R * B] and
        the actor core's outputs [R, B, rnn_size] (its hidden state after each step)."""
        num_steps, batch = episode_start.shape
        features, critic_features = self._features(obs)
        actor_state = state if self.critic_core is None else state[:, : self.actor_core.state_size]
        out = self.actor_core.sequence(features.view(num_steps, batch, -1), actor_state, episode_start)
        critic_out = out
        if self.critic_core is not None:
            critic_out = self.critic_core.sequence(
                critic_features.view(num_steps, batch, -1), state[:, self.actor_core.state_size :], episode_start
            )
        params = self.legal(self.policy_head(out.reshape(num_steps * batch, -1)), obs)
        values = self.value_head(critic_out.reshape(num_steps * batch, -1)).squeeze(-1)
        return params, values, out

    def direct_gradients(self, obs: dict) -> bool:
        """Whether loss_gradients runs for `obs`: the separate MLP stacks (see _stacks), categorical
        actions, the compiled kernels on CPU float32, no bf16."""
        return (
            self._stacks is not None
            and self.distribution.kind == "discrete"
            and not self.bf16
            and not self.masked
            and kernels.use_kernels(next(iter(obs.values())))
        )

    def loss_gradients(self, obs: dict, loss_and_grads):
        """A training step's forward and backward without autograd, where direct_gradients(obs): both stacks'
        forward (compiled), loss_and_grads(logits [B, n], normalized values [B]) -> (stats, d loss / d
        logits, d loss / d values), and both stacks' backward adding into each parameter's .grad. The
        gradients of autograd through forward() and the same loss (tests/test_ops.py). Returns stats."""
        inputs = [encoder.prepare(encoder.keys[0], obs[encoder.keys[0]]) for encoder, *_ in self._stacks]
        outputs = [kernels.mlp_outputs(x, *stack) for x, (_, *stack) in zip(inputs, self._stacks)]
        stats, grad_logits, grad_values = loss_and_grads(outputs[0][-1], outputs[1][-1].squeeze(-1))
        for x, out, grad, (_, *stack) in zip(inputs, outputs, (grad_logits, grad_values.unsqueeze(1)), self._stacks):
            kernels.mlp_backward_into(grad, x, out, *stack)
        return stats

    def values(self, obs: dict) -> torch.Tensor:
        """Feed-forward models only (a recurrent model's values come from forward with a state, or
        forward_sequence)."""
        if self._stacks is not None and not self.bf16:
            encoder, *stack = self._stacks[1]
            return mlp(encoder.prepare(encoder.keys[0], obs[encoder.keys[0]]), *stack).squeeze(-1)
        encoder = self.critic_encoder or self.actor_encoder
        return self.value_head(encoder(obs)).squeeze(-1)

    def update_normalizers(self, obs: dict, returns: torch.Tensor) -> None:
        """Learner only: the actor encoder's and the returns' statistics merged; a critic encoder takes a copy."""
        super().update_normalizers(obs, returns)
        if self.critic_encoder is not None:
            for key, normalizer in self.critic_encoder.normalizers.items():
                normalizer.load_state_dict(self.actor_encoder.normalizers[key].state_dict())


class UserActorCritic(PolicyValueModel):
    """PPO's network around a user's whole network (--model, sf_engine.model.user_model): the module takes what a
    user's encoder takes (Encoder.user_inputs: float32, uint8 scaled, normalized with --normalize_input) and
    returns (params [B, P], values [B]); the action mask, the distribution and --normalize_returns stay the
    engine's. Under --bf16 the module runs under bfloat16 autocast, its outputs back in float32."""

    def __init__(self, spec, mcfg, bf16: bool = False):
        """`mcfg`: a resolved ModelConfig naming the network (mcfg.model)."""
        super().__init__()
        self.bf16 = bf16
        self.distribution = ActionDistribution(spec.action)
        self.masked = spec.action_mask
        self.inputs = Encoder(spec, mcfg, networks=False)
        self.network = user_model(mcfg.model, spec)
        self.log_std = nn.Parameter(torch.zeros(self.distribution.num_std)) if self.distribution.num_std else None
        self.return_normalizer = RunningMeanStd(()) if mcfg.normalize_returns else None
        self.auxiliary_loss = None  # the third output of the last forward with gradients

    @property
    def input_encoder(self):
        return self.inputs

    def plus_auxiliary_loss(self, loss: torch.Tensor) -> torch.Tensor:
        auxiliary, self.auxiliary_loss = self.auxiliary_loss, None
        return loss if auxiliary is None else loss + auxiliary

    def forward(self, obs: dict):
        """Distribution parameters [B, P] (illegal actions masked) and normalized values [B]; a third output of
        the module, its auxiliary loss, is kept for the learner when gradients are on (plus_auxiliary_loss)."""
        inputs = self.inputs.user_inputs(obs)
        if self.bf16:
            with torch.autocast(next(iter(obs.values())).device.type, dtype=torch.bfloat16):
                outputs = self.network(inputs)
        else:
            outputs = self.network(inputs)
        params, values = outputs[0], outputs[1]
        if len(outputs) == 3 and torch.is_grad_enabled():
            self.auxiliary_loss = outputs[2].float()
        return self.legal(params.float(), obs), values.float()


def obs_tensors(obs: dict, device="cpu") -> dict:
    """A batched env's observations (key -> numpy [B, ...]) as tensors on `device`, dtypes kept."""
    return {key: torch.as_tensor(value, device=device) for key, value in obs.items()}
