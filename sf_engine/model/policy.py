"""The acting model of a run: what the policy worker, the evaluator, enjoy.py and export build, and what the
learner publishes the weights of."""

from __future__ import annotations

from torch import nn

from sf_engine.model.actor_critic import ActorCritic
from sf_engine.model.q_network import QNetwork
from sf_engine.model.sac_networks import SACActor


def build_policy(spec, cfg, bf16: bool = False) -> nn.Module:
    """The acting model of a run of `cfg` (a resolved Config): the Q-network of the value-based algorithms, SAC's
    squashed Gaussian actor, else the actor-critic."""
    if cfg.acts_on_q:
        return QNetwork(spec, cfg.model, cfg.q, bf16)
    if cfg.learner.algo == "sac":
        return SACActor(spec, cfg.model, bf16)
    return ActorCritic(spec, cfg.model, bf16)
