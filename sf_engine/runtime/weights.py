"""A policy's weights shared between processes: the one place that knows the shared weight vector and its
sequence lock.

The learner owns the weights and publishes every new version; the policy worker and the evaluator copy
them in when the version moves. The whole state of a model (parameters and the normalizers' floating
buffers) is one flat float32 vector (sf_engine.model.flat_state.flatten_state), so publishing and reading are
one copy each. The shared vector is a `share_memory_()` tensor on the CPU, or the learner's CUDA tensor (readers get
it through CUDA IPC); it reaches each reader once, through that reader's channel (see wiring.Queues),
and again when the supervisor asks for it for a restarted reader (`want`).

Sequence lock: `param_seq[policy]` in the shared buffers is 2 x version while the vector is whole and
odd while the learner writes; a reader copies, then checks that the counter did not move.

A learner that dies takes its shared vector with it (a CUDA tensor lives as long as the process that made
it), so every publish also copies the weights into the file beside the run's shared memory (held by the
main process, see SharedBuffers.last_published): a restarted learner starts from them, and makes a new shared
vector, bumping `weights_generation`; a reader holding an older vector drops it and takes the new one.

torch is imported where a tensor is handled, not with the module: the supervisor (in the main process,
which needs no torch) asks for the weights again through `want`.
"""

from __future__ import annotations

import logging
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
        self.generation = buffers.weights_generation[policy : policy + 1]
        self.copied = buffers.published_copy[policy : policy + 1]  # version + 1 of the copy in the file, 0: none
        self.buffers, self.channels, self.policy = buffers, channels, policy
        self.shared = None  # the shared vector, once created (writer) or received (reader)
        self.held_generation = 0  # the generation of the vector held (a reader's) or made (the writer's)
        self._mirror = None  # the writer's: a tensor view of its row of the last published weights (False: none)
        self.reader = None  # a reader's role, once it connected

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
        self.generation[0] += 1  # before the vector goes out: a reader that sees it moved waits for the new one
        self.held_generation = int(self.generation[0])
        for reader in readers:
            self.channels[(reader, self.policy)].put((self.held_generation, self.shared))
        self.publish(params, version)

    def publish(self, params, version: int) -> None:
        """Copy `params` into the shared vector (and the copy that outlives this process); readers never
        see a half-written set."""
        import torch

        self.seq[0] = 2 * version + 1
        self.shared.copy_(params)
        if self._mirror is None:
            self._mirror = self._map_mirror(params.numel())
        if self._mirror is not False:
            self._mirror.copy_(params)  # from CUDA: a synchronous copy
            self.copied[0] = version + 1
        if self.shared.device.type == "cuda":
            torch.cuda.synchronize(self.shared.device)
        self.seq[0] = 2 * version

    def _map_mirror(self, floats: int):
        """This policy's row of the last published weights as a tensor, or False where there is no room."""
        import torch

        try:
            return torch.from_numpy(self.buffers.last_published(floats, allocate=True)[self.policy])
        except OSError as exc:
            logging.warning(
                "no copy of the published weights (%s): a restarted learner starts from its last checkpoint",
                exc.strerror or exc,
            )
            return False

    def last_published(self, floats: int):
        """(version, a copy of the `floats` weights) as the previous learner published them last, or None
        when it never published, died in the middle of a publish (the copy is then torn) or made no copy
        of that version (no room for it)."""
        seq = int(self.seq[0])
        if seq % 2 or int(self.copied[0]) != seq // 2 + 1:
            return None
        rows = self.buffers.last_published(floats, allocate=False)
        return None if rows is None else (seq // 2, rows[self.policy].copy())

    def serve_requests(self) -> None:
        """Send the shared vector again to every reader the supervisor restarted (once per process restarted: several
        policy workers share their role's channel)."""
        for i, reader in enumerate(WEIGHT_READERS):
            wanted = int(self.wanted[i])
            if wanted:
                self.wanted[i] -= wanted
                for _ in range(wanted):
                    self.channels[(reader, self.policy)].put((self.held_generation, self.shared))

    # --- the supervisor ------------------------------------------------------------------------
    def retire(self) -> None:
        """The learner died and its vector with it (on CUDA its memory goes with the process): readers stop
        reading it, keep the weights they copied, and take the next learner's vector once it comes."""
        self.generation[0] += 1

    def want(self, reader: str) -> None:
        """A restarted `reader` needs the shared vector again (the learner sends it at its next step)."""
        self.wanted[WEIGHT_READERS.index(reader)] += 1

    # --- the readers ---------------------------------------------------------------------------
    def connect(self, reader: str, timeout_sec: float) -> bool:
        """Receive the shared vector on `reader`'s channel (waits at most `timeout_sec`); True once held.
        A vector of an earlier learner (one that died) is dropped for the newest one: each travels with
        its generation, and goes out only after the generation moved to it."""
        current, self.reader = int(self.generation[0]), reader
        if self.shared is not None and self.held_generation == current:
            return True
        channel = self.channels[(reader, self.policy)]
        while self.shared is None or self.held_generation < current:
            try:  # nothing held: wait for a vector; an older one held: only look (it serves meanwhile)
                generation, shared = channel.get(timeout=max(timeout_sec, 1e-3) if self.shared is None else 1e-4)
            except Empty:
                break  # what is held (if anything) is the newest that arrived; the next call looks again
            except (OSError, RuntimeError, EOFError) as exc:  # a dead learner's vector: gone with its process
                logging.info("skipped the shared weights of a learner that died (%s)", exc.__class__.__name__)
                continue
            if self.shared is None or generation >= self.held_generation:
                self.held_generation, self.shared = generation, shared
        return self.shared is not None

    def read_into(self, local):
        """Copy the newest whole version into the tensor `local`; returns that version, or None while the
        learner is being replaced (its vector retired, the next one not here yet: `local` keeps what it
        holds). On CUDA the copy is awaited before the counter is checked again (copy_ only queues it)."""
        import torch

        if self.held_generation != int(self.generation[0]):
            self.connect(self.reader, 1e-3)  # the next learner's vector, if it is here
            if self.held_generation != int(self.generation[0]):
                return None
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
