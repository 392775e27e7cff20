"""A user's whole network, `--model module:Class` (PPO's; docs/api.md, your own network): in place of the encoders,
cores and heads of sf_engine.model.actor_critic.ActorCritic, `Class(observation_space, action_space)` builds a
torch.nn.Module whose forward(obs) returns (distribution parameters [B, P], values [B]), or a third output, an
auxiliary loss (a scalar the learner adds to PPO's loss: an auxiliary head's training). The engine keeps what lies
around it (sf_engine.model.actor_critic.UserActorCritic): the inputs as a user's encoder gets them, the action mask,
the action distribution (sampling, log-probs, entropies, a Gaussian's learned log-std) and --normalize_returns.
Feed-forward: the recurrent cores are the built-in networks'.

The module is imported as `--env module:Class` is (the current directory first), in every process that builds the
acting model: nothing of it travels but its weights. Deciding needs no torch; `check_model` builds the network once
while the plan is made, so that a bad --model is one ConfigError line before anything on disk changes.
Runs in the main process (the plan) and in every process that builds a model: learner, policy worker, evaluator,
enjoy.py, load_policy, export.
"""

from __future__ import annotations

from sf_engine.config.groups import ConfigError
from sf_engine.envs.spec import action_space, observation_space
from sf_engine.envs.user_code import import_user_module, user_attribute
from sf_engine.model.encoders import SAMPLE_ROWS, built_and_tried, described, sample_inputs

FORM = "module:Class"
# the model flags of the built-in networks that env families and algorithms set defaults for: a run with --model
# takes none of those defaults (it takes neither flag)
BUILT_IN_NETWORK_FLAGS = ("encoder", "rnn")


def model_class(name: str):
    """The class (or any callable) that `--model name` names, its module imported; ConfigError with one line if
    there is none."""
    found = user_attribute(import_user_module(name, "--model", ConfigError), name, "--model", ConfigError)
    if not callable(found):
        raise ConfigError(
            f"--model {name}: {name.replace(':', '.')} is a {type(found).__name__}, not a class: name a "
            f"Class(observation_space, action_space) -> torch.nn.Module"
        )
    return found


def check_model(cfg, spec) -> list:
    """The main process, while the plan is made: `--model` of `cfg` with the flags it cannot go with refused, then
    its network built for the env of `spec` and run on a sample batch, as every process will build it. ConfigError
    with one line where it cannot be; else the plan's note on it. No --model: no notes. (An algorithm that takes no
    whole network refuses --model in sf_engine.config.algorithms.check_algorithm_flags.)"""
    mcfg, name = cfg.model, cfg.model.model
    if not name:
        return []
    if mcfg.encoder != "auto":
        raise ConfigError(f"--model {name} replaces the encoder and the heads: drop --encoder {mcfg.encoder}")
    if mcfg.rnn != "none":
        raise ConfigError(
            f"--model {name} is a feed-forward network (the recurrent cores are the built-in networks'): drop "
            f"--rnn {mcfg.rnn}, or bring the memory inside your module"
        )
    network = user_model(name, spec)
    parameters = sum(p.numel() for p in network.parameters())
    skipped = "the compiled CPU kernels" + (" and --bf16's bfloat16 weight copies" if cfg.run.bf16 else "")
    init = "; --weight_init leaves it as it is" if mcfg.weight_init != "scaled" else ""
    return [
        f"--model {name}: a user's whole network ({parameters:,} parameters); it runs as plain torch ops"
        f"{' under bfloat16 autocast' if cfg.run.bf16 else ''}: {skipped} are the built-in networks' only{init}"
    ]


def _outputs_wanted(spec) -> str:
    """What forward returns for the env of `spec`, in words."""
    return (
        f"(distribution parameters: {_parameters(spec.action)}, values [B]) and optionally an auxiliary loss [], "
        f"float tensors"
    )


def _parameters(action) -> str:
    """The distribution parameters of `action` (an ActionSpec), in words."""
    from sf_engine.model.distributions import ActionDistribution

    if action.kind == "composite":
        parts = "; ".join(_parameters(part) for part in action.parts)
        return f"each part's side by side [B, {ActionDistribution(action).num_params}] ({parts})"
    return {
        "discrete": lambda: f"logits [B, {action.nvec[0]}]",
        "multi_discrete": lambda: f"each dimension's logits side by side [B, {sum(action.nvec)}]",
        "multi_binary": lambda: f"one logit per bit [B, {action.shape[0]}]",
        "continuous": lambda: f"the Gaussian's means [B, {action.shape[0] if action.shape else 0}]",
    }[action.kind]()


def user_model(name: str, spec):
    """The network of `--model name` for the env of `spec`: Class(observation_space, action_space) (the spaces
    rebuilt from the spec: sf_engine.envs.spec), then run once, in eval mode without gradients, on a sample batch,
    which must give (params [B, P], values [B]) of floats, or a third, a scalar auxiliary loss. ConfigError with one
    line where it does not."""
    import torch

    from sf_engine.model.distributions import ActionDistribution

    cls = model_class(name)
    called = f"--model {name}: {getattr(cls, '__name__', type(cls).__name__)}(observation_space, action_space)"
    build = lambda: cls(observation_space(spec.obs), action_space(spec.action))  # noqa: E731
    network, outputs = built_and_tried(f"--model {name}", called, build, spec)
    sample = sample_inputs(spec)
    wanted = [[SAMPLE_ROWS, ActionDistribution(spec.action).num_params], [SAMPLE_ROWS]]
    if isinstance(outputs, (tuple, list)) and len(outputs) == 3:
        wanted.append([])  # the auxiliary loss, a scalar
    pair = isinstance(outputs, (tuple, list)) and len(outputs) in (2, 3)
    tensors = pair and all(isinstance(x, torch.Tensor) for x in outputs)
    if not tensors or [list(x.shape) for x in outputs] != wanted or not all(x.is_floating_point() for x in outputs):
        got = (
            f"({', '.join(f'a {x.dtype} tensor {list(x.shape)}' for x in outputs)})"
            if tensors
            else f"a {type(outputs).__name__}"
        )
        raise ConfigError(
            f"--model {name}: its module returned {got} for a batch of {SAMPLE_ROWS} observations "
            f"({described(sample)}); it must return {_outputs_wanted(spec)}"
        )
    return network
