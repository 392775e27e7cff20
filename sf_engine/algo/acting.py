"""The acting model of a run: what the policy worker, the evaluator, enjoy.py, load_policy and export build, and what
the learner publishes the weights of. Its algorithm's class says which (`acting_network`, named by the spec); it keeps
the acting contract (sf_engine.model.acting.ActingNetwork)."""

from __future__ import annotations

from sf_engine.config.algorithms import built_in_algorithms, import_class
from sf_engine.config.fields import ConfigError
from sf_engine.envs.user_code import describe_exception


def build_policy(spec, cfg, bf16: bool = False):
    """The acting model (an nn.Module) of a run of `cfg` (a resolved Config) on the env of `spec`."""
    return import_class(cfg.algorithm.learner).acting_network(spec, cfg, bf16)


def check_acting_network(cfg, spec) -> None:
    """A user's algorithm (--algo MODULE:SPEC or a registered one; the built-in ones keep the contract): its acting
    network built once in the main process, while the plan is made (`cfg`: its model flags resolved); one ConfigError
    line where building it fails or it breaks the acting contract, before anything starts or is written."""
    name = cfg.learner.algo
    if name in built_in_algorithms():
        return
    from torch import nn  # a user's algorithm's plan only: the main process imports torch for it

    from sf_engine.model.acting import contract_breaches

    try:
        network = build_policy(spec, cfg)
    except Exception as exc:  # the user's code: its own error, where it was raised
        raise ConfigError(f"--algo {name}: acting_network raised {describe_exception(exc)}") from None
    missing = contract_breaches(network)
    if missing or not isinstance(network, nn.Module):
        what = ", ".join(missing) if missing else "nn.Module"
        raise ConfigError(
            f"--algo {name}: its acting network ({type(network).__name__}) lacks {what} of the acting contract: an "
            f"nn.Module with recurrent, state_size, initial_state, outputs, refresh_bf16_acting and act(obs, state, "
            f"ctx) -> ActOutput (sf_engine.ActingNetwork, docs/api.md#the-acting-contract); or return the built-in "
            f"ActorCritic"
        )
