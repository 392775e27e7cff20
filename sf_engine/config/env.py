"""The env group of the configuration (cfg.env): which env, who steps it, its seed and how a Dict observation's
parts are encoded (sf_engine.envs.observations)."""

from __future__ import annotations

from dataclasses import dataclass

from sf_engine.config.fields import flag_field as _f

TEXTS, DISCRETES = ("bag", "drop"), ("onehot", "embed")  # --text_obs, --discrete_obs (sf_engine.envs.observations)


@dataclass(frozen=True)
class EnvConfig:
    env: str = _f(
        "CartPole-v1",
        "Environment id: an EnvPool id or registered Gymnasium id (CartPole-v1, ALE/Pong-v5, ...), a device env "
        "(TorchCartPole-v1, gymnax/NAME, brax/NAME, playground/NAME) or module:attr (your own; docs/environments.md).",
    )
    env_backend: str = _f(
        "auto",
        "Who steps the envs: 'envpool' (C++ batched), 'gymnasium' (vector env in the worker), 'device' (a device env: "
        "torch tensors on --device, stepped with the acting network in one sampler process), or 'auto' (device for a "
        "device env, else EnvPool when it has the id).",
        choices=("auto", "envpool", "gymnasium", "device"),
    )
    seed: int = _f(0, "Base random seed; worker w's envs and the networks derive theirs from it.")
    text_obs: str = _f("bag", "A Dict observation's text: 'bag', a count per token; 'drop', left out.", choices=TEXTS)
    discrete_obs: str = _f(
        "onehot", "A Dict observation's Discrete parts: 'onehot'; 'embed', rows of a learned table.", choices=DISCRETES
    )
