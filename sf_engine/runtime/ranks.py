"""The ranks of one policy's learner, joined by torch.distributed: data-parallel learning.

N learner processes (ranks) train one policy, each on its own share of the data. Before each optimizer step the
gradient, one flat vector per optimizer (sf_engine.model.flat_state.FlatAdam), is summed over the ranks and divided
by N (`average_`), so every rank takes the same step from the same weights and holds the same weights after it, bit
for bit: `checksum` sums the weights' bits, and `same_everywhere` compares the ranks' sums. NCCL between GPUs, gloo on
the CPU (several ranks may share the host) and between ranks that share a GPU (their tensors go through the host's
memory: NCCL puts one rank on a GPU). Every collective runs under the group's timeout: where a rank died or
hangs, the others get a CollectiveError of one line naming the operation and the rank, never a hang.

Runs in each learner process; the ranks meet through a rendezvous file (`file://`, on one machine) or, with node
groups on several machines, a store of one generation of their rendezvous (sf_engine.runtime.rendezvous).
"""

from __future__ import annotations

import datetime
import inspect
import os
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist


def _takes_device_id() -> bool:
    return "device_id" in inspect.signature(dist.init_process_group).parameters


class CollectiveError(RuntimeError):
    """A collective of the learner's ranks did not complete (a rank died, hangs, or disagrees): one line."""


class Agreement(NamedTuple):
    """What the ranks agreed on before a round (RankGroup.agree): the batches every rank can train now (the fewest
    of any rank's; 0: a rank has nothing yet), whether any saw the run stop, and the run's env steps and seconds as
    the furthest rank read them (the round's schedules: every rank the same values)."""

    batches: int
    stop: bool
    env_steps: int
    elapsed_sec: float

    @property
    def all_ready(self) -> bool:
        return self.batches > 0


class RankGroup:
    def __init__(
        self,
        rank: int,
        world: int,
        meet: str | dist.Store,
        device: torch.device,
        timeout_sec: float,
        nodes: int = 1,
        on_fault: Callable[[], None] = lambda: None,
        backend: str = "",
    ):
        """Join the group of `world` ranks as `rank` (blocks until all have joined, at most `timeout_sec`) where they
        meet (`meet`: a rendezvous address, or a store of their own); the collectives run on `backend` (empty:
        `device`'s, NCCL for CUDA, gloo otherwise; gloo for ranks that share a GPU). `nodes`: the node groups the
        ranks are spread over, world / nodes each, in rank order; `on_fault`: called when a collective fails, before
        CollectiveError is raised."""
        if not 0 <= rank < world or world % nodes:
            raise ValueError(f"rank {rank} is not one of the {world} ranks in {nodes} equal node groups")
        self.rank, self.world, self.device, self.timeout_sec = rank, world, device, timeout_sec
        self.nodes, self.node, self.on_fault = nodes, rank // (world // nodes), on_fault
        where = {"init_method": meet} if isinstance(meet, str) else {"store": meet}
        backend = backend or ("nccl" if device.type == "cuda" else "gloo")
        self.backend = backend
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if backend == "nccl":
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")  # a timeout raises in the collective, not later
        self._run(
            "joining the group",
            lambda: dist.init_process_group(
                backend,
                **where,
                rank=rank,
                world_size=world,
                timeout=datetime.timedelta(seconds=timeout_sec),
                # NCCL: the device of this rank, known at once (a lazy init would pick cuda:0 on every rank; torch 2.3+)
                **({"device_id": device} if backend == "nccl" and _takes_device_id() else {}),
            ),
        )

    def _run(self, what: str, call: Callable):
        try:
            return call()
        except (RuntimeError, ValueError) as exc:  # torch's DistBackendError and timeouts are RuntimeErrors
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.on_fault()
            raise CollectiveError(
                f"learner rank {self.rank} of {self.world}: {what} did not complete within {self.timeout_sec:g} s "
                f"(another rank died or hangs): {first}"
            ) from exc

    def average_(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` (a gradient) replaced by its mean over the ranks, in place; returned."""
        summed = tensor.to(self._collective_device())  # gloo on a GPU: a copy in the host's memory
        self._run("a gradient all-reduce", lambda: dist.all_reduce(summed, op=dist.ReduceOp.SUM))
        if summed is not tensor:
            tensor.copy_(summed)
        return tensor.div_(self.world)

    def same_everywhere(self, value: int) -> bool:
        """Whether every rank passed the same integer (a checksum): one all-reduce of (value, -value) by maximum."""
        largest, negated = self.maximum([value, -value], "a comparison of the ranks' weights")
        return largest == -negated

    def agree(self, batches: int, stopping: bool, env_steps: int, elapsed_sec: float) -> Agreement:
        """One all-reduce by maximum: each rank says how many batches it can train now (0: none yet), whether it saw
        the run stop, and the env steps (its node group's) and seconds it read; every rank gets the same Agreement,
        its env steps the sum over the node groups of the furthest reading of each."""
        steps = [int(env_steps) if node == self.node else 0 for node in range(self.nodes)]
        values = [-int(batches), int(stopping), int(elapsed_sec * 1e6)] + steps
        fewest, stop, micros, *furthest = self.maximum(values, "the ranks' agreement on the next round")
        return Agreement(-fewest, bool(stop), sum(furthest), micros / 1e6)

    def maximum(self, values: list[int], what: str) -> list[int]:
        """Each of the integers `values` at its maximum over the ranks (one all-reduce; `what`: named in an error)."""
        tensor = torch.tensor(values, dtype=torch.int64, device=self._collective_device())
        self._run(what, lambda: dist.all_reduce(tensor, op=dist.ReduceOp.MAX))
        return [int(x) for x in tensor.tolist()]

    def gather(self, vector: torch.Tensor) -> torch.Tensor:
        """Every rank's `vector` (the same length on each), as rows [world, len] in rank order, on every rank."""
        vector = vector.to(self._collective_device()).contiguous()
        rows = [torch.empty_like(vector) for _ in range(self.world)]
        self._run("a gather of the ranks' figures", lambda: dist.all_gather(rows, vector))
        return torch.stack(rows)

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """Rank 0's `data` (the others pass None), on every rank."""
        size = torch.tensor([len(data) if self.rank == 0 else 0], dtype=torch.int64, device=self._collective_device())
        self._run("a broadcast of rank 0's size", lambda: dist.broadcast(size, 0))
        if self.rank == 0:
            payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self._collective_device())
        else:
            payload = torch.empty(int(size), dtype=torch.uint8, device=self._collective_device())
        self._run("a broadcast of rank 0's state", lambda: dist.broadcast(payload, 0))
        return payload.cpu().numpy().tobytes()

    def _collective_device(self) -> torch.device:
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def close(self) -> None:
        """Leave the group (its rendezvous file is the caller's)."""
        if dist.is_initialized():
            dist.destroy_process_group()


def checksum(*flats: torch.Tensor) -> int:
    """The sum of the bits of float32 vectors read as int32 (a change of any weight in any bit changes it but by
    chance; the same weights give the same sum on any device)."""
    return sum(int(flat.detach().view(torch.int32).sum(dtype=torch.int64)) for flat in flats)
