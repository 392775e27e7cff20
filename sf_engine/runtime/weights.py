"""A policy's weights shared between processes: the one place that knows the shared weight vector and its
sequence lock.

The learner owns the weights and publishes every new version; the policy worker and the evaluator copy
them in when the version moves. The whole state of a model (parameters and the normalizers' floating
buffers) is one flat float32 vector (sf_engine.model.kernels.flatten_state), so publishing and reading are
one copy each. The shared vector is a `share_memory_()` tensor on the CPU, or the learner's CUDA tensor (readers get
it through CUDA IPC); it reaches each reader once, through that reader's channel (see wiring.Queues),
and again when the supervisor asks for it for a restarted reader (`want`).

Sequence lock: `param_seq[policy]` in the shared buffers is 2 x version while the vector is whole and
odd while the learner writes; a reader copies, then checks that the counter did not move.

torch is imported where a tensor is handled, not with the module: the supervisor (in the main process,
which needs no torch) asks for the weights again through `want`.
"""

from __future__ import annotations

import time

from sf_engine.runtime.ipc import Empty
from sf_engine.runtime.shared_buffers import WEIGHT_READERS

READ_TIMEOUT_SEC = 30.0


class SharedWeights:
    """Policy `policy`'s shared weights, seen from one process. `buffers`: the run's SharedBuffers
    (param_seq, params_wanted); `channels`: {(reader role, policy): channel} that carry the shared vector."""

    def __init__(self, buffers, channels: dict, policy: int = 0):
        self.seq = buffers.param_seq[policy : policy + 1]
        self.wanted = buffers.params_wanted[policy]
        self.channels, self.policy = channels, policy
        self.shared = None  # the shared vector, once created (writer) or received (reader)

    @property
    def version(self) -> int:
        """The version published last (a write may be under way)."""
        return int(self.seq[0]) // 2

    # --- the learner ---------------------------------------------------------------------------
    def create(self, params, version: int, readers: tuple) -> None:
        """Make the shared copy of `params` (a flat vector, see flatten_state), publish `version` and
        send the copy to each of `readers`."""
        self.shared = params.detach().clone()
        if self.shared.device.type == "cpu":
            self.shared.share_memory_()
        self.publish(params, version)
        for reader in readers:
            self.channels[(reader, self.policy)].put(self.shared)

    def publish(self, params, version: int) -> None:
        """Copy `params` into the shared vector; readers never see a half-written set."""
        import torch

        self.seq[0] = 2 * version + 1
        self.shared.copy_(params)
        if self.shared.device.type == "cuda":
            torch.cuda.synchronize(self.shared.device)
        self.seq[0] = 2 * version

    def serve_requests(self) -> None:
        """Send the shared vector again to every reader the supervisor restarted."""
        for i, reader in enumerate(WEIGHT_READERS):
            if self.wanted[i]:
                self.wanted[i] = 0
                self.channels[(reader, self.policy)].put(self.shared)

    # --- the supervisor ------------------------------------------------------------------------
    def want(self, reader: str) -> None:
        """A restarted `reader` needs the shared vector again (the learner sends it at its next step)."""
        self.wanted[WEIGHT_READERS.index(reader)] = 1

    # --- the readers ---------------------------------------------------------------------------
    def connect(self, reader: str, timeout_sec: float) -> bool:
        """Receive the shared vector on `reader`'s channel (waits at most `timeout_sec`); True once held."""
        if self.shared is None:
            try:
                self.shared = self.channels[(reader, self.policy)].get(timeout=max(timeout_sec, 1e-3))
            except Empty:
                return False
        return True

    def read_into(self, local) -> int:
        """Copy the newest whole version into the tensor `local`; returns that version. On CUDA the copy
        is awaited before the counter is checked again (copy_ only queues it)."""
        import torch

        deadline = time.monotonic() + READ_TIMEOUT_SEC
        while time.monotonic() < deadline:
            before = int(self.seq[0])
            if before % 2:
                time.sleep(0)
                continue
            local.copy_(self.shared)
            if local.is_cuda:
                torch.cuda.current_stream(local.device).synchronize()
            if int(self.seq[0]) == before:
                return before // 2
        raise TimeoutError(f"the learner's weights stayed mid-write for {READ_TIMEOUT_SEC:g} s")
