"""Which ways of running the recurrent core pay for themselves: forward + backward of one training
minibatch of the core as the learner runs it with CartPole defaults (64 units, 64 input features,
sequences [T=32, B=32], one torch thread), GRU and LSTM, with few and with many episode starts.

  .venv/bin/python perf/rnn_ways.py --repeats 25 --calls 5

Ways: the compiled loops ('native') and the torch loops ('torch'). Commit 6182c82 had three more,
measured by this script there and dropped since (they did not pay with the compiled loops built):
'native_onednn' (the compiled loops with the large products on oneDNN's kernel instead of
torch.mm), the NumPy loops ('numpy') and nn.GRU / nn.LSTM over padded stretches ('padded'); a way
the checkout or build lacks is left out. The repeats interleave the ways (a slow spell of the
machine touches them all); each figure is the median over the repeats of the mean of --calls calls.
Prints a table (stderr) and one JSON line last: ms per minibatch, forward + backward.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sf_engine.model import recurrent  # noqa: E402

STEPS, BATCH, FEATURES, SIZE = 32, 32, 64, 64


@contextlib.contextmanager
def _patched(name, value):
    """recurrent.<name> = value for the duration (the forward/backward functions look it up per call)."""
    old = getattr(recurrent, name)
    setattr(recurrent, name, value)
    try:
        yield
    finally:
        setattr(recurrent, name, old)


def _loops(way):
    return _patched("loops_for", lambda tensor, loops=None: way)


@contextlib.contextmanager
def _both(first, second):
    with first, second:
        yield


def _ways(kind):
    """{way: (context factory, run(module, x, state, episode_start) -> outputs)} available here."""

    def written_out(module, x, state, starts):
        weights = (module.weight_ih_l0, module.weight_hh_l0, module.bias_ih_l0, module.bias_hh_l0)
        return recurrent.run_sequence(kind, x, state, starts, weights)[..., :SIZE]

    ways = {}
    if recurrent.NATIVE is not None:
        if hasattr(recurrent, "_onednn"):  # large products on oneDNN ('native_onednn') or on torch.mm
            ways["native_onednn"] = (lambda: _loops("native"), written_out)
            ways["native"] = (lambda: _both(_loops("native"), _patched("_onednn", lambda: None)), written_out)
        else:
            ways["native"] = (lambda: _loops("native"), written_out)
    if hasattr(recurrent, "_NUMPY"):
        ways["numpy"] = (lambda: _loops("numpy"), written_out)
    ways["torch"] = (lambda: _loops("torch"), written_out)
    if hasattr(recurrent, "padded_sequence"):
        ways["padded"] = (contextlib.nullcontext, recurrent.padded_sequence)
    return ways


def _case(kind, starts, generator):
    module = (torch.nn.GRU if kind == "gru" else torch.nn.LSTM)(FEATURES, SIZE)
    x = torch.randn(STEPS, BATCH, FEATURES, generator=generator, requires_grad=True)
    state = torch.randn(BATCH, SIZE * (2 if kind == "lstm" else 1), generator=generator)
    episode_start = torch.zeros(STEPS, BATCH, dtype=torch.bool)
    where = torch.randperm((STEPS - 1) * BATCH, generator=generator)[:starts]
    episode_start[1:].view(-1)[where] = True  # `starts` episodes start inside the sequences
    grad = torch.randn(STEPS, BATCH, SIZE, generator=generator)
    return module, x, state, episode_start, grad


def _time(context, run, case, calls):
    module, x, state, episode_start, grad = case
    with context():
        start = time.perf_counter()
        for _ in range(calls):
            run(module, x, state, episode_start).backward(grad)
        return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--calls", type=int, default=5, help="Calls per timing.")
    parser.add_argument("--starts", type=int, nargs="+", default=[3, 60], help="Episode starts per minibatch.")
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    cases = {}
    for kind in ("gru", "lstm"):
        for starts in args.starts:
            case = _case(kind, starts, generator)
            for way, (context, run) in _ways(kind).items():
                cases[f"{kind}_starts{starts}_{way}"] = (context, run, case)
    for context, run, case in cases.values():  # warm-up (oneDNN primitives, NumPy, first allocations)
        _time(context, run, case, 2)
    times = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, (context, run, case) in cases.items():
            times[name].append(_time(context, run, case, args.calls))
    out = {
        "bench": "rnn_ways",
        "machine": platform.machine(),
        "torch": torch.__version__,
        "threads": 1,
        "steps_x_batch": f"{STEPS}x{BATCH}",
        "features": FEATURES,
        "units": SIZE,
        "repeats": args.repeats,
        "calls": args.calls,
        "onednn_products": getattr(recurrent, "_onednn", lambda: None)() is not None,
    }
    for name, values in times.items():
        out[f"{name}_ms"] = round(statistics.median(values), 3)
        print(
            f"{name:28s} {out[f'{name}_ms']:8.3f} ms  (min {min(values):.3f}, max {max(values):.3f})", file=sys.stderr
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
