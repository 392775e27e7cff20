"""The encoder registry: what `--encoder` names. An encoder turns a batch of observations into features [B, F]; the
engine adds the recurrent cores and the heads of every algorithm after it. An entry is a factory:

- a built-in one (`BuiltinEncoder`): an MLP per vector entry and a CNN of sf_engine.model.cnn per image entry,
  built from the model flags and run on the engine's fast paths (the compiled CPU kernels, --bf16's weight
  copies);
- a user's one, `factory(observation_space) -> torch.nn.Module`: registered by `register_encoder(name, factory)`
  before training starts, or named on the command line as `module:callable` (imported as `--env module:Class`
  is, the current directory first, in every process that builds a model). Its module runs as plain torch ops.

Deciding needs no torch (the main process resolves the plan without it; a user's module imports it);
`user_network` builds a user's module and finds its features F by one forward of a sample batch: `check_encoder`
does it once while the plan is made, so that a bad `--encoder` is one ConfigError line before anything on disk
changes, and every process that builds the model does it again.
Runs in the main process (the plan), and in every process that builds a model: learner, policy worker,
evaluator, the replaying process, export command.
"""

from __future__ import annotations

import difflib
import os
import pickle
from dataclasses import dataclass
from typing import Callable

from sf_engine.config.groups import ConfigError
from sf_engine.envs.spec import ACTION_MASK_KEY, observation_space
from sf_engine.envs.user_code import describe_exception, import_user_module, user_attribute

FORM = "module:callable"  # a user's encoder named on the command line
SAMPLE_ROWS = 2  # the batch of the sample observations a user's module is run on once, to find F


@dataclass(frozen=True)
class BuiltinEncoder:
    """A built-in encoder: `cnn`, the name of a builder in sf_engine.model.cnn ([C, H, W] shape, layer_norm ->
    its CNN), for each image entry; without one, images are flattened into an MLP like vectors."""

    cnn: str | None = None

    def image_network(self, shape_chw: tuple, layer_norm: bool):
        """The CNN of an image entry of [C, H, W] `shape_chw` (with PQN's layer norms: `layer_norm`)."""
        from sf_engine.model import cnn

        return getattr(cnn, self.cnn)(shape_chw, layer_norm=layer_norm)


_REGISTRY: dict[str, Callable] = {}
_BUILTIN_NAMES: set[str] = set()


def register_encoder(name: str, factory: Callable) -> None:
    """Register `factory(observation_space) -> torch.nn.Module` under `name`, usable as `--encoder name`. The
    module maps a batch of observations (a float tensor [B, *shape] for a Box space, a dict key -> tensor for a
    Dict space) to features [B, F]. Call it before training starts (sf_engine.run.plan.build_plan), in the
    script that starts it: the run's processes receive the factory with the plan, so it must be picklable (a
    module-level function or class) unless --mode serial."""
    if not isinstance(name, str) or not name or ":" in name or name == "auto" or name in _BUILTIN_NAMES:
        raise ValueError(
            f"register_encoder: {name!r} cannot name an encoder: use a plain name, not 'auto', one with ':' "
            f"(the {FORM} form) or a built-in one ({', '.join(sorted(_BUILTIN_NAMES))})"
        )
    if not callable(factory):
        raise ValueError(f"register_encoder: the factory of {name!r} is not callable: give factory(observation_space)")
    _REGISTRY[name] = factory


def _register_builtin(name: str, factory: BuiltinEncoder) -> None:
    _REGISTRY[name] = factory
    _BUILTIN_NAMES.add(name)


_register_builtin("mlp", BuiltinEncoder())
_register_builtin("nature_cnn", BuiltinEncoder("nature_cnn"))  # the small CNN for images under 36 pixels
_register_builtin("impala_cnn", BuiltinEncoder("ImpalaCNN"))
_register_builtin("convnet_simple", BuiltinEncoder("SimpleCNN"))


def registered_encoders() -> dict:
    """name -> factory of every register_encoder() call in this process (the built-in ones left out)."""
    return {name: factory for name, factory in _REGISTRY.items() if name not in _BUILTIN_NAMES}


def user_registration(name: str) -> tuple:
    """The run plan's registrations for encoder `name`: ((register_encoder, name, factory),) when it was
    registered in this process by register_encoder (its children register it again), else ()."""
    factory = registered_encoders().get(name)
    return () if factory is None else ((register_encoder, name, factory),)


def encoder_factory(name: str) -> Callable:
    """The factory that `--encoder name` (resolved: not 'auto') names: a BuiltinEncoder, a registered
    factory, or the callable of `module:callable`, imported; ConfigError with one line if none."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        factory = user_attribute(import_user_module(name, "--encoder", ConfigError), name, "--encoder", ConfigError)
        if not callable(factory):
            raise ConfigError(
                f"--encoder {name}: {name.replace(':', '.')} is a {type(factory).__name__}, not callable: name a "
                f"factory(observation_space) -> torch.nn.Module"
            )
        return factory
    closest = difflib.get_close_matches(name, list(_REGISTRY), n=1)
    hint = f"did you mean {closest[0]}? " if closest else ""
    raise ConfigError(
        f"--encoder {name}: no encoder of that name in this process: {hint}the registered ones are auto, "
        f"{', '.join(_REGISTRY)}; a user's is registered by sf_engine.register_encoder(name, factory) in the "
        f"process that trains or loads it, or named as {FORM} (a factory(observation_space) -> torch.nn.Module "
        f"in module.py of the current directory)"
    )


def is_builtin(name: str) -> bool:
    """Whether `--encoder name` is a built-in encoder ('auto' too, which resolves to one), else a user's module."""
    return name == "auto" or name in _BUILTIN_NAMES


def sees_whole_images(name: str) -> bool:
    """Whether `--encoder name` (resolved) takes image entries as images (a CNN, a user's module), not
    flattened into an MLP: --rnn_size auto sizes the core by it."""
    return name not in _BUILTIN_NAMES or _REGISTRY[name].cnn is not None


def check_encoder(cfg, spec) -> list:
    """The main process, while the plan is made: `--encoder` of `cfg` found, and a user's module built for the
    env of `spec` and run on a sample batch, as every process will build it. ConfigError with one line where it
    cannot be; else the plan's notes on it (a line saying what a user's module runs without)."""
    name = cfg.model.encoder
    if name == "auto" or isinstance(encoder_factory(name), BuiltinEncoder):  # 'auto' is a built-in one
        return []
    if cfg.run.mode != "serial" and name in _REGISTRY:  # sent to the run's processes with the plan
        try:
            pickle.dumps(_REGISTRY[name])
        except Exception:
            raise ConfigError(
                f"--encoder {name}: its register_encoder factory cannot be sent to the run's processes; register "
                f"a module-level function or class, not a lambda or closure (or use --mode serial)"
            ) from None
    network, features = user_network(name, spec)
    parameters = sum(p.numel() for p in network.parameters())
    skipped = "the compiled CPU kernels" + (" and --bf16's bfloat16 weight copies" if cfg.run.bf16 else "")
    unused = {"--layer_norm": cfg.q.layer_norm, "--weight_init": cfg.model.weight_init != "scaled"}
    flags = [flag for flag, used in unused.items() if used]
    left = f"; {' and '.join(flags)} leave{'s' if len(flags) == 1 else ''} it as it is" if flags else ""
    return [
        f"--encoder {name}: a user's module ({parameters:,} parameters, features [B, {features}]); it runs as "
        f"plain torch ops{' under bfloat16 autocast' if cfg.run.bf16 else ''}: {skipped} are the built-in "
        f"encoders' only{left}"
    ]


def built_and_tried(flag: str, called: str, build, spec):
    """A user's module made by `build()` and run once, in eval mode without gradients, on a sample batch of the env
    of `spec`: (the module, its outputs). ConfigError with one line where `build` raises or returns no
    torch.nn.Module, or the module fails on the batch (`flag`: '--encoder NAME'; `called`: the call as it reads)."""
    import torch

    try:
        network = build()
    except Exception as exc:
        raise ConfigError(f"{called} raised {describe_exception(exc, libraries())}") from None
    if not isinstance(network, torch.nn.Module):
        raise ConfigError(f"{called} returned a {type(network).__name__}, not a torch.nn.Module")
    sample, training = sample_inputs(spec), network.training
    try:
        with torch.no_grad():
            outputs = network.eval()(sample)
    except Exception as exc:
        raise ConfigError(
            f"{flag}: its module failed on a sample batch of float32 observations ({described(sample)}): "
            f"{describe_exception(exc, libraries())}"
        ) from None
    finally:
        network.train(training)
    return network, outputs


def sample_inputs(spec, rows: int = SAMPLE_ROWS):
    """A user's module's input for a batch of `rows` zero observations of `spec`: float32 [rows, *shape] per
    entry (sf_engine.model.features.Encoder.user_inputs), a dict of them for a Dict observation."""
    import torch

    inputs = {key: torch.zeros(rows, *shape) for key, shape, _ in spec.obs if key != ACTION_MASK_KEY}
    return inputs if spec.is_dict else inputs["obs"]


def described(sample) -> str:
    """'obs [2, 4]', or 'image [2, 3, 8, 8], vector [2, 2]': the shapes of sample_inputs' `sample`, for an error."""
    entries = sample.items() if isinstance(sample, dict) else [("obs", sample)]
    return ", ".join(f"{key} {list(x.shape)}" for key, x in entries)


def libraries() -> tuple:
    """The folders of torch and sf_engine: not the user's code, which an error names the line of."""
    import torch

    return os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__))


def user_network(name: str, spec) -> tuple:
    """(the module of the user's encoder `--encoder name` for the env of `spec`, its features F): the factory
    called on the observation space (sf_engine.envs.spec.observation_space), then the module run once, in eval
    mode without gradients, on a sample batch, which must give features [B, F] of floats. ConfigError with one
    line where it does not."""
    import torch

    factory = encoder_factory(name)
    called = f"--encoder {name}: {getattr(factory, '__name__', type(factory).__name__)}(observation_space)"
    network, features = built_and_tried(f"--encoder {name}", called, lambda: factory(observation_space(spec.obs)), spec)
    shapes = described(sample_inputs(spec))
    shape = list(features.shape) if isinstance(features, torch.Tensor) else None
    if shape is None or len(shape) != 2 or shape[0] != SAMPLE_ROWS or shape[1] < 1 or not features.is_floating_point():
        got = f"a {features.dtype} tensor {shape}" if shape is not None else f"a {type(features).__name__}"
        raise ConfigError(
            f"--encoder {name}: its module returned {got} for a batch of {SAMPLE_ROWS} observations ({shapes}); "
            f"it must return features [B, F] of floats, F >= 1"
        )
    return network, shape[1]
