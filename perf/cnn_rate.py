"""How close a CNN's training step is to what this CPU's cores can multiply: the encoder's forward and
backward on one minibatch, in FLOP/s, against torch's best dense matrix product in the same precision.

  python perf/cnn_rate.py                      # Nature CNN, 1,024 frames of 4x84x84, 2 threads
  python perf/cnn_rate.py --encoder impala_cnn --threads 1
The FLOPs are torch's own count (torch.utils.flop_counter) of the same forward and backward (no gradient for the input
frames, as in the learner), in channels-last layout like the learner's. Prints one JSON line: ms per minibatch (the
shortest of --repeats, alternating with the product), GFLOP/s of the CNN and of a 4096x4096 matrix product, in float32
and (where the CPU has native bfloat16) under bf16 autocast, and the CNN's share of the matrix product's rate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def best_times(fns: list, repeats: int) -> list:
    """The shortest of `repeats` calls of each of `fns`, taken in turn (this machine's speed drifts)."""
    best = [float("inf")] * len(fns)
    for fn in fns:
        fn()
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--encoder", default="nature_cnn", choices=("nature_cnn", "impala_cnn"))
    parser.add_argument("--minibatch", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=8, help="Calls of each, alternating; the shortest counts.")
    args = parser.parse_args()
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from sf_engine.model.cnn import ImpalaCNN, NatureCNN
    from sf_engine.runtime.device import cpu_has_native_bf16, keep_freed_memory

    keep_freed_memory()
    torch.set_num_threads(args.threads)
    model = (NatureCNN if args.encoder == "nature_cnn" else ImpalaCNN)((4, 84, 84))
    model = model.to(memory_format=torch.channels_last)
    frames = torch.rand(args.minibatch, 4, 84, 84).contiguous(memory_format=torch.channels_last)
    a, b = torch.randn(4096, 4096), torch.randn(4096, 4096)

    def step():
        model.zero_grad(set_to_none=False)
        model(frames).sum().backward()

    with FlopCounterMode(display=False) as counter:
        step()
    flops = counter.get_total_flops()
    out = {
        "bench": "cnn_rate",
        "encoder": args.encoder,
        "minibatch": args.minibatch,
        "threads": args.threads,
        "gflop_per_minibatch": round(flops / 1e9, 2),
    }
    precisions = ["float32"] + (["bf16"] if cpu_has_native_bf16() else [])
    for precision in precisions:
        mm_a, mm_b = (a, b) if precision == "float32" else (a.bfloat16(), b.bfloat16())

        def cnn_step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                step()

        cnn_sec, mm_sec = best_times([cnn_step, lambda: mm_a @ mm_b], args.repeats)
        cnn_rate, mm_rate = flops / cnn_sec / 1e9, 2 * 4096**3 / mm_sec / 1e9
        out[precision] = {
            "cnn_ms": round(cnn_sec * 1e3, 1),
            "cnn_gflops": round(cnn_rate, 1),
            "matmul_gflops": round(mm_rate, 1),
            "cnn_share_of_matmul": round(cnn_rate / mm_rate, 2),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
