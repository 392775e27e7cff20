"""The model's shape decisions: what 'auto' means for the encoder, the actor-critic split and the size of
the recurrent core, and how much recurrent state an env carries. Made once by the main process for the
run plan (sf_engine.run.plan), before any model is built; kept apart from sf_engine.model.actor_critic, which builds
the networks from the resolved values, so that deciding needs no torch.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from sf_engine.model.encoders import sees_whole_images


def resolve_model_config(mcfg, spec):
    """The model's shape decisions, made once by the main process for the run plan: --encoder auto is
    the Nature CNN for image observations ('mlp' without images); --actor_critic auto is 'separate'
    for feed-forward models of vector observations, 'shared' otherwise; --rnn_size auto is 256 where an
    encoder sees images whole (a CNN, a user's module), 64 otherwise. Returns a ModelConfig without 'auto' (but
    for --encoder auto beside --model: a user's whole network has no encoder)."""
    encoder = mcfg.encoder if mcfg.encoder != "auto" or mcfg.model else ("nature_cnn" if spec.has_image else "mlp")
    actor_critic = mcfg.actor_critic
    if actor_critic == "auto":
        actor_critic = "separate" if mcfg.rnn == "none" and not spec.has_image else "shared"
    rnn_size = mcfg.rnn_size
    if rnn_size == "auto":
        rnn_size = 256 if spec.has_image and sees_whole_images(encoder) else 64
    return dataclasses.replace(mcfg, encoder=encoder, actor_critic=actor_critic, rnn_size=int(rnn_size))


def state_size(mcfg) -> int:
    """Floats of recurrent state per env of a resolved ModelConfig: 0 without --rnn; an LSTM keeps
    (h, c); a 'separate' actor-critic has a core each."""
    if mcfg.rnn == "none":
        return 0
    return mcfg.rnn_size * (2 if mcfg.rnn == "lstm" else 1) * (2 if mcfg.actor_critic == "separate" else 1)


def flag_text(value) -> str:
    """A flag's value as it is written on the command line: 0.0003, true, none, a,b."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(flag_text(v) for v in value)
    return str(value)


class FlagChange(NamedTuple):
    """A flag whose value differs between a saved configuration (`old`) and this run's (`new`)."""

    flag: str
    old: object
    new: object

    def __str__(self) -> str:
        return f"{self.flag} was {flag_text(self.old)}, now {flag_text(self.new)}"


def changed_flags(saved: dict, cfg, spec) -> list[FlagChange]:
    """The flags ('--env' and model flags) whose values in `saved` (Config.to_dict() as config.json and
    checkpoints hold it; an 'auto' of an older version is resolved first) differ from the resolved
    `cfg`, with both values: a model saved with them does not fit. ValueError if `saved` is not such a dict."""
    from sf_engine.config.groups import ModelConfig

    try:
        changed = []
        if "model" in saved:
            old = resolve_model_config(ModelConfig(**saved["model"]), spec)
            changed = [
                FlagChange(f"--{f.name}", getattr(old, f.name), getattr(cfg.model, f.name))
                for f in dataclasses.fields(old)
                if getattr(old, f.name) != getattr(cfg.model, f.name)
            ]
        if saved.get("env", {}).get("env") != cfg.env.env:
            changed.insert(0, FlagChange("--env", saved.get("env", {}).get("env"), cfg.env.env))
        policies = saved.get("policies", {}).get("num_policies", 1)
        if policies != cfg.policies.num_policies:
            changed.append(FlagChange("--num_policies", policies, cfg.policies.num_policies))
        return changed
    except (TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not a configuration of this version of sf_engine ({exc.__class__.__name__})") from None
