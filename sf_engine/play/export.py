"""Export a trained policy (sf-export, or python -m sf_engine.play.export): an ONNX file and a TorchScript
file that run without sf_engine (onnxruntime, or torch.jit.load), and policy.json describing them.

The exported policy acts greedily: it takes the observations as the env gives them (one input per
observation entry, the env's dtype, any batch size; with --rnn also the core's state) and returns the
action the env takes (the most likely one, shifted by a Discrete space's start; the Gaussian mean
clipped to the action space), the value estimate, and with --rnn the new state, which the caller feeds
back and zeroes where an episode starts. Observation normalization is inside the graph.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import warnings

import torch
from torch import nn

from sf_engine.model.acting import GREEDY
from sf_engine.play.enjoy import experiment_parser
from sf_engine.play.loading import LoadError, first_line, load_policy, resolve_checkpoint

FORMATS = ("onnx", "torchscript", "both")
OPSET = 18


def _core_step(core, x: torch.Tensor, state: torch.Tensor):
    """One step of a RecurrentCore through its nn.GRU / nn.LSTM (which ONNX and TorchScript know):
    (output, new state), the state laid out as the engine keeps it (h, or h and c concatenated)."""
    if core.kind == "gru":
        out, h = core.rnn(x.unsqueeze(0), state.unsqueeze(0))
        return out[0], h[0]
    h, c = state.split(core.out_size, dim=-1)
    out, (h, c) = core.rnn(x.unsqueeze(0), (h.unsqueeze(0).contiguous(), c.unsqueeze(0).contiguous()))
    return out[0], torch.cat([h[0], c[0]], dim=-1)


class GreedyPolicy(nn.Module):
    """An acting model (an ActorCritic, a QNetwork or SAC's actor) as a function of plain tensors: (obs entries...,
    [state]) -> (action, value, [new state])."""

    def __init__(self, model, spec):
        super().__init__()
        self.model, self.spec, self.keys, self.action = model, spec, [key for key, _, _ in spec.obs], spec.action
        if spec.action.kind == "composite":  # per column: a discrete part's start, a Box part's bounds
            columns = [_columns(part) for part in spec.action.parts]
            for i, name in enumerate(("start", "low", "high")):
                self.register_buffer(name, torch.tensor([v for part in columns for v in part[i]], dtype=torch.float32))
            return
        self.register_buffer("start", torch.tensor(spec.action.start or (0,), dtype=torch.int64))
        if spec.action.kind == "continuous":
            self.register_buffer("low", torch.tensor(spec.action.low, dtype=torch.float32))
            self.register_buffer("high", torch.tensor(spec.action.high, dtype=torch.float32))

    def forward(self, *inputs):
        """The acting contract's greedy `act` (a built-in recurrent model's `greedy`, its core stepped through nn.GRU /
        nn.LSTM, which the exporters know), then the env's action: a Discrete space's start added, a Gaussian's mean
        clipped to the bounds (SAC's squashed one is within)."""
        obs = dict(zip(self.keys, inputs))
        model = self.model
        if model.recurrent:
            action, value, *state = model.greedy(obs, inputs[-1], _core_step)
        else:
            action, _, value, _ = model.act(obs, None, GREEDY)
            state = []
        if self.action.kind == "composite":
            action = torch.minimum(torch.maximum(action + self.start, self.low), self.high)
        elif self.action.kind == "continuous":
            action = torch.minimum(torch.maximum(action, self.low), self.high)
        else:
            action = action + (self.start[0] if self.action.kind == "discrete" else self.start)
        return (action, value, *state)


def _columns(part) -> tuple:
    """(start, low, high) of each column of a composite action's `part` (an ActionSpec)."""
    if part.kind == "continuous":
        return [0.0] * part.width, list(part.low), list(part.high)
    start = list(part.start) if part.start else [0] * part.width
    return start, [-float("inf")] * part.width, [float("inf")] * part.width


def _action_info(action) -> dict:
    """policy.json's description of the action space (a composite's parts with their columns of the output)."""
    info = {"kind": action.kind, "nvec": list(action.nvec), "low": list(action.low), "high": list(action.high)}
    if action.kind == "multi_binary":
        info["bits"] = action.width
    if action.kind == "composite":
        names = action.keys or range(len(action.parts))
        info["parts"] = [
            {**_action_info(part), "name": name, "columns": [lo, hi]}
            for name, (part, lo, hi) in zip(names, action.part_columns)
        ]
    return info


def describe(model, spec) -> dict:
    """policy.json: the inputs and outputs of the exported files, by name, with dtypes and shapes
    (B: any batch size)."""
    inputs = [{"name": key, "dtype": dtype, "shape": ["B", *shape]} for key, shape, dtype in spec.obs]
    action = spec.action
    outputs = [
        {"name": "action", "dtype": action.dtype, "shape": ["B", *action.buffer_shape]},
        {"name": "value", "dtype": "float32", "shape": ["B"]},
    ]
    if model.recurrent:
        inputs.append({"name": "state", "dtype": "float32", "shape": ["B", model.state_size]})
        outputs.append({"name": "state_out", "dtype": "float32", "shape": ["B", model.state_size]})
    return {
        "inputs": inputs,
        "outputs": outputs,
        "action": _action_info(action),
        "recurrent": model.recurrent,
        "note": "greedy actions; with a recurrent core feed state_out back as state, zeros where an episode starts",
    }


def example_inputs(model, spec, batch: int = 2) -> tuple:
    inputs = [torch.zeros((batch, *shape), dtype=getattr(torch, dtype)) for _, shape, dtype in spec.obs]
    if model.recurrent:
        inputs.append(torch.zeros(batch, model.state_size))
    return tuple(inputs)


def export_onnx(policy: GreedyPolicy, info: dict, path: str) -> None:
    """ONNX through torch.export, any batch size."""
    inputs = example_inputs(policy.model, policy.spec)
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    program = torch.onnx.export(
        policy,
        inputs,
        input_names=[i["name"] for i in info["inputs"]],
        output_names=[o["name"] for o in info["outputs"]],
        dynamic_shapes=(tuple({0: batch} for _ in inputs),),
        opset_version=OPSET,
        dynamo=True,
        verbose=False,
    )
    program.save(path)


def export_torchscript(policy: GreedyPolicy, path: str) -> None:
    """TorchScript by tracing (torch.jit.load runs it), any batch size."""
    torch.jit.trace(policy, example_inputs(policy.model, policy.spec), check_trace=False).save(path)


def _exported(name: str, other: str, write) -> None:
    """`write()` the file of format `name`, or a LoadError of one line where the exporter cannot trace the model
    (a user's whole network, --model, may hold what it does not know)."""
    try:
        write()
    except Exception as exc:
        while exc.__cause__ is not None:  # the exporter's own error wraps the one that names the operator
            exc = exc.__cause__
        why = re.sub(r"\x1b\[[0-9;]*m", "", first_line(exc))  # without the exporter's terminal colours
        raise LoadError(
            f"the {name} export failed ({exc.__class__.__name__}: {why}): --format {other} writes the other file alone"
        ) from None


def export(model, spec, out_dir: str, formats: str = "both") -> list:
    """Write the greedy policy of `model` (an acting model on the CPU) to `out_dir`; returns the paths."""
    policy = GreedyPolicy(model.cpu().eval(), spec).eval()
    info = describe(model, spec)
    os.makedirs(out_dir, exist_ok=True)
    written = []
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # the exporter's notes on optional packages
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's notes on its own deprecations
        if formats in ("onnx", "both"):
            written.append(os.path.join(out_dir, "policy.onnx"))
            _exported("ONNX", "torchscript", lambda: export_onnx(policy, info, written[-1]))
        if formats in ("torchscript", "both"):
            written.append(os.path.join(out_dir, "policy.torchscript.pt"))
            _exported("TorchScript", "onnx", lambda: export_torchscript(policy, written[-1]))
    written.append(os.path.join(out_dir, "policy.json"))
    with open(written[-1], "w") as f:
        json.dump(info, f, indent=2)
    return written


def parse_args(argv=None):
    parser = experiment_parser(__doc__)
    parser.add_argument("--format", default="both", choices=FORMATS, help="Which files to write.")
    parser.add_argument(
        "--output", default=None, help="Directory the files go to (default: <train_dir>/<experiment>/export)."
    )
    return parser.parse_args(argv)


def run(args) -> int:
    import importlib.util

    from sf_engine.play.loading import load_experiment

    if args.format in ("onnx", "both"):  # before anything is loaded or written
        missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
        if missing:
            raise LoadError(
                f"--format {args.format} needs the {' and '.join(missing)} package(s): pip install "
                f"'sf_engine[onnx]' (or --format torchscript)"
            )
    cfg, spec, exp_dir = load_experiment(args.train_dir, args.experiment)
    out_dir = args.output or os.path.join(exp_dir, "export")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise LoadError(f"--output {out_dir} is a file: choose a directory")
    path = resolve_checkpoint(exp_dir, args.experiment, args.checkpoint)
    model = load_policy(cfg, spec, path, "cpu", getattr(args, "policy", 0))
    for written in export(model, spec, out_dir, args.format):
        print(f"wrote {written}")
    print(f"policy of {cfg.env.env} from {os.path.basename(path)}: inputs and outputs in policy.json")
    return 0


def main(argv=None) -> int:
    from sf_engine.config.groups import ConfigError
    from sf_engine.envs import EnvError

    try:
        return run(parse_args(argv))
    except (ConfigError, LoadError, EnvError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
