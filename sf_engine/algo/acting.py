"""The acting model of a run: what the policy worker, the evaluator, enjoy.py, load_policy and export build, and what
the learner publishes the weights of. Its algorithm's class says which (`acting_network`, named by the spec)."""

from __future__ import annotations

from torch import nn

from sf_engine.config.algorithms import import_class


def build_policy(spec, cfg, bf16: bool = False) -> nn.Module:
    """The acting model of a run of `cfg` (a resolved Config) on the env of `spec`."""
    return import_class(cfg.algorithm.learner).acting_network(spec, cfg, bf16)
