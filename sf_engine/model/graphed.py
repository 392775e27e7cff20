"""--compile for acting: the policy worker's forward (a model's `outputs(obs, state)`) at a few fixed batch
sizes, each batch padded up to the next bucket. On CUDA each bucket is a CUDA graph (captured once: one
launch replays every kernel of the forward); on the CPU each bucket is torch.compile'd once (no recompiling
for every new batch size).

Rows are independent in every model here (MLP, CNN, recurrent cores; no batch norm), so the padding rows,
whatever they hold, change nothing in the real rows. The graphs read the model's weights where they are:
the policy worker reloads weights in place (weights.SharedWeights.read_into), so a replay always sees the
latest published ones.
"""

from __future__ import annotations

from typing import Callable

import torch


def bucket_sizes(unit: int, most_units: int) -> list[int]:
    """Batch sizes in rows: `unit` rows (one request) times 1, 2, 4, ... up to `most_units` requests."""
    units, sizes = 1, []
    while units < most_units:
        sizes.append(units * unit)
        units *= 2
    return sizes + [most_units * unit]


class BucketedForward:
    """outputs(obs, state) -> (params or Q-values, values, new state or None), padded to fixed sizes.

    `forward`: the model's outputs method; `example`: one row of each observation key (tensors [1, ...] on the
    device, dtypes as acted on); `state_size`: the recurrent state's width (0: no core)."""

    def __init__(self, forward: Callable, example: dict, state_size: int, sizes: list[int], device):
        self.sizes, self.device, self.state_size = sizes, torch.device(device), state_size
        self.cuda = self.device.type == "cuda"
        self._inputs: dict[int, tuple] = {}  # size -> (obs, state) its graph or compiled call reads
        self._outputs: dict[int, tuple] = {}  # size -> the CUDA graph's output tensors
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._forward = forward
        self._compiled = None if self.cuda else torch.compile(forward, dynamic=False)
        for size in sizes:
            obs = {key: value.expand(size, *value.shape[1:]).clone() for key, value in example.items()}
            state = torch.zeros(size, state_size, device=self.device) if state_size else None
            self._inputs[size] = (obs, state)

    def bucket(self, rows: int) -> int:
        """The smallest bucket that holds `rows` (ValueError past the largest)."""
        for size in self.sizes:
            if size >= rows:
                return size
        raise ValueError(f"a batch of {rows} rows is past the largest bucket ({self.sizes[-1]})")

    def warm_up(self) -> None:
        """Capture (CUDA) or compile (CPU) every bucket now, before acting starts."""
        for size in self.sizes:
            self._run(size)

    def __call__(self, obs: dict, state=None) -> tuple:
        rows = next(iter(obs.values())).shape[0]
        if rows > self.sizes[-1]:  # more requests than splits (a restarted worker's stale ones too): uncompiled
            return self._forward(obs, state)
        size = self.bucket(rows)
        inputs, in_state = self._inputs[size]
        for key, value in obs.items():
            inputs[key][:rows].copy_(value, non_blocking=True)
        if state is not None:
            in_state[:rows].copy_(state, non_blocking=True)
        return tuple(None if x is None else x[:rows] for x in self._run(size))

    def _run(self, size: int) -> tuple:
        obs, state = self._inputs[size]
        if not self.cuda:
            return self._compiled(obs, state)
        if size not in self._graphs:
            self._capture(size)
        self._graphs[size].replay()
        return self._outputs[size]

    def _capture(self, size: int) -> None:
        """A CUDA graph of the forward at `size` rows: warmed up on a side stream first, as capture needs."""
        obs, state = self._inputs[size]
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                self._forward(obs, state)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._outputs[size] = self._forward(obs, state)
        self._graphs[size] = graph
