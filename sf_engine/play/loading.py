"""A trained policy out of an experiment: its resolved config and env spec, the checkpoint to play (the
latest valid, the best, or a file), and the actor-critic with that checkpoint's weights. Each failure is
a LoadError with one line saying what is wrong and what to do. Runs in the replaying process
(enjoy.py, sf-enjoy), the exporter and a checkpoint opponent's loader.
"""

from __future__ import annotations

import json
import os


class LoadError(RuntimeError):
    """A problem the user can fix, in one line (sf_engine.LoadError): a run or a checkpoint that cannot be loaded
    or played as asked. enjoy.py and the exporter print it and exit with code 2."""


def resolve_checkpoint(exp_dir: str, experiment: str, choice: str) -> str:
    from sf_engine.runtime.checkpoint import BEST_NAME, checkpoint_dir, latest_valid_checkpoint

    if choice == "latest":
        path, skipped = latest_valid_checkpoint(checkpoint_dir(exp_dir), load=True)
        if path is None and skipped:
            raise LoadError(f"experiment {experiment} has no usable checkpoint ({skipped[-1][1]})")
        if path is None:
            raise LoadError(
                f"experiment {experiment} has no checkpoint yet: train it first "
                f"(python train.py --experiment {experiment})"
            )
        for _, reason in skipped:
            print(f"skipping checkpoint: {reason}: using the one before it", flush=True)
        return path
    if choice == "best":
        path = os.path.join(checkpoint_dir(exp_dir), BEST_NAME)
        if not os.path.exists(path):
            raise LoadError(
                f"experiment {experiment} has no best checkpoint: train it with --eval_every_sec "
                f"or use --checkpoint latest"
            )
        return path
    if not os.path.isfile(choice):
        raise LoadError(f"--checkpoint {choice}: no such file")
    return choice


def first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [exc.__class__.__name__])[0]


def load_policy(cfg, spec, path: str, device, policy: int = 0):
    """The actor-critic of `cfg` with the weights of checkpoint `path` (of its policy `policy` where it
    holds several), or a LoadError saying why not."""
    from sf_engine.algo.acting import build_policy
    from sf_engine.model.shape import changed_flags, flag_text
    from sf_engine.runtime.checkpoint import CheckpointError, load_checkpoint, policy_states

    try:
        state = load_checkpoint(path, "cpu")
    except CheckpointError as exc:
        raise LoadError(f"checkpoint {exc}: pass an older one with --checkpoint PATH") from None
    if not isinstance(state, dict) or ("model" not in state and not state.get("policies")):
        raise LoadError(f"checkpoint {path} is not an sf_engine checkpoint: pick one from <experiment>/checkpoints")
    saved = state.get("config", {})
    try:
        changed = changed_flags({"env": {"env": cfg.env.env}} | saved, cfg, spec) if isinstance(saved, dict) else []
        changed = [change for change in changed if change.flag != "--num_policies"]  # one policy of it is loaded
    except ValueError as exc:
        raise LoadError(
            f"checkpoint {path}: its configuration is {exc}: pick a checkpoint of this experiment"
        ) from None
    if changed:
        differences = ", ".join(f"{c.flag} {flag_text(c.old)} (experiment: {flag_text(c.new)})" for c in changed)
        raise LoadError(
            f"checkpoint {path} does not fit experiment {cfg.run.experiment}: it was trained with {differences}: "
            f"pick a checkpoint of this experiment"
        )
    states = policy_states(state)
    if not 0 <= policy < len(states):
        raise LoadError(f"--policy {policy}: checkpoint {path} holds policies 0..{len(states) - 1}")
    model = build_policy(spec, cfg)
    try:
        model.load_state_dict(states[policy]["model"])
    except (KeyError, RuntimeError, TypeError) as exc:
        why = _shape_difference(model.state_dict(), states[policy].get("model")) or first_line(exc)
        raise LoadError(
            f"checkpoint {path} does not fit the model of experiment {cfg.run.experiment} ({why}): pick a "
            f"checkpoint of this experiment"
        ) from None
    return model.to(device).eval()


def _shape_difference(expected: dict, saved) -> str:
    """The first weight whose shape differs, or that one side lacks, between the model's own state dict
    and a checkpoint's: 'encoder.0.weight is [64, 4] in the checkpoint, [64, 6] here'; '' if none does."""
    if not isinstance(saved, dict):
        return "the checkpoint holds no model weights"
    for name, tensor in expected.items():
        if name not in saved:
            return f"the checkpoint has no {name}"
        shape = list(getattr(saved[name], "shape", []))
        if shape != list(tensor.shape):
            return f"{name} is {shape} in the checkpoint, {list(tensor.shape)} here"
    extra = [name for name in saved if name not in expected]
    return f"the checkpoint has {extra[0]}, which this model has not" if extra else ""


def load_experiment(train_dir: str, experiment: str) -> tuple:
    """(config, env spec, experiment directory) of a trained experiment, its config resolved; or an
    LoadError saying what is wrong."""
    import dataclasses

    from sf_engine.config.groups import Config
    from sf_engine.envs import probe_env_spec
    from sf_engine.model.shape import resolve_model_config

    exp_dir = os.path.join(train_dir, experiment)
    if not os.path.exists(os.path.join(exp_dir, "config.json")):
        raise LoadError(f"no experiment at {exp_dir} (config.json missing): check --experiment and --train_dir")
    unreadable = exp_dir + "/config.json is unreadable ({}): was it written by this version of train.py?"
    try:
        with open(os.path.join(exp_dir, "config.json")) as f:
            cfg = Config.from_dict(json.load(f))
    except (ValueError, TypeError, AttributeError) as exc:
        raise LoadError(unreadable.format(exc.__class__.__name__)) from None
    spec = probe_env_spec(cfg.env.env, cfg.env.env_backend, cfg.env.text_obs, cfg.env.discrete_obs)
    try:  # a config.json of an older version may hold 'auto'
        return dataclasses.replace(cfg, model=resolve_model_config(cfg.model, spec)), spec, exp_dir
    except (ValueError, TypeError) as exc:
        raise LoadError(unreadable.format(exc.__class__.__name__)) from None
