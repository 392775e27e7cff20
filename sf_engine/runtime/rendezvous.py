"""Where the learner ranks of several node groups (machines, --dist_init) meet, and meet again after a fault.

Node group 0's main process serves a TCP store (torch.distributed's; under torchrun its agent may serve it) for the
whole run, so it outlives every learner. Ranks join a group in a generation: each reads the store's generation,
claims its rank in it and waits until every rank of the world has claimed its own, then makes its process group over
the generation's own keys. A rank that leaves a generation on a fault (a collective that timed out), or finds its
rank claimed there already (by a predecessor that died, in this run or an earlier attempt), moves the store on to
the next generation (once, whoever says so first), and every rank waiting in the old one follows: the node groups
restart their ranks on their own, at their own pace, and meet in the same new generation, never in keys an earlier
group used. The store also keeps the node groups' stop (or a refusal's line), which ends any rank's wait to join.
"""

from __future__ import annotations

import contextlib
import datetime
import secrets
import time
from typing import Callable

import torch.distributed as dist

from sf_engine.config.parallel import NodeGroups
from sf_engine.runtime.ranks import CollectiveError
from sf_engine.runtime.role import RunStopped

POLL_SEC = 0.05
CONNECT_SEC = 5.0  # a try to reach the store
JOIN_TIMEOUTS = 4  # a join waits this many --collective_timeout_sec: the others may first wait one out, then restart
_GENERATION, _STOP = "generation", "stop"
_STOPPED = "stopped"  # the stop key's value at a stop (else a refusal's line)


def _store(groups: NodeGroups, serves: bool, timeout_sec: float) -> dist.TCPStore:
    return dist.TCPStore(
        groups.host,
        groups.port,
        is_master=serves,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout_sec),
    )


def serve(groups: NodeGroups, timeout_sec: float) -> dist.TCPStore | None:
    """The store served by this process (node group 0's main process, while the run lives), or None where another
    serves it. RuntimeError (the port taken, the host not this machine's) as from torch."""
    return _store(groups, True, timeout_sec) if groups.serves else None


class NodeGroupsStopped(Exception):
    """The node groups stopped while this rank was joining them (another node group's stop): leave cleanly."""


class Rendezvous:
    def __init__(self, groups: NodeGroups, rank: int, world: int, timeout_sec: float, beat: Callable, shape: str):
        """Reach the store (waiting at most JOIN_TIMEOUTS x `timeout_sec` for it to be served) as rank `rank` of
        `world`; `beat`: called while waiting, so that the supervisor sees the rank alive; `shape`: what every rank
        must share (their number, the sizes of each one's batch, the flags that shape training), compared at each
        join."""
        self.rank, self.world, self.beat, self.shape = rank, world, beat, shape
        self.wait_sec = JOIN_TIMEOUTS * timeout_sec
        self.token = secrets.token_hex(8)  # this process's claim on its rank in a generation
        deadline = time.monotonic() + self.wait_sec
        while True:  # a few seconds at a time, beating between: node group 0 may start later
            try:
                store = _store(groups, False, min(CONNECT_SEC, max(0.1, deadline - time.monotonic())))
                break
            except RuntimeError as exc:
                if time.monotonic() >= deadline:
                    raise CollectiveError(
                        f"learner rank {rank} of {world}: the node groups' rendezvous at {groups.host}:{groups.port} "
                        f"(--dist_init) was not reached within {self.wait_sec:g} s: {_first_line(exc)}"
                    ) from None
                beat()
        store.set_timeout(datetime.timedelta(seconds=timeout_sec))
        self.store = dist.PrefixStore(groups.prefix, store)

    def generation(self) -> int:
        return int(self.store.add(_GENERATION, 0))

    def leave(self, generation: int) -> None:
        """A fault in `generation`: every join from now meets in the next one (only the first to say so moves it).
        Nothing where the store is gone (node group 0 stopped)."""
        with contextlib.suppress(RuntimeError):
            self.store.compare_set(_GENERATION, str(generation), str(generation + 1))

    def stop(self, why: str = _STOPPED) -> None:
        """The node groups stop (`why`: a refusal's line, else their stop): a rank joining later leaves at once."""
        with contextlib.suppress(RuntimeError):
            self.store.compare_set(_STOP, "", why)

    def join(self, stopping: Callable[[], bool]) -> tuple[int, dist.Store]:
        """Wait until every rank has claimed its place in the store's generation (following it where it moves on);
        returns (the generation, the store of its keys). A claim already made on this rank in the generation (a
        predecessor's, before it died) moves the store on to the next. NodeGroupsStopped where the node groups
        stopped, or this node group's run does (`stopping()`); RunStopped where another rank refused them (its line)
        or their shapes differ; CollectiveError after the wait's timeout (that generation left)."""
        deadline = time.monotonic() + self.wait_sec
        while True:
            generation = self.generation()
            shape = self.store.compare_set(f"{generation}/shape", "", self.shape).decode()
            if shape != self.shape:
                why = (
                    f"learner rank {self.rank}: the node groups' learner ranks do not fit together (this node group: "
                    f"{self.shape}; another: {shape}): give every node group the same flags but for --dist_rank, "
                    f"and batches of the same shape (set --num_envs_per_worker where auto sizing differs)"
                )
                self.stop(why)
                raise RunStopped(why)
            claim = self.store.compare_set(f"{generation}/rank/{self.rank}", "", self.token).decode()
            if claim != self.token:  # a predecessor of this rank arrived in it: a new generation
                self.leave(generation)
                continue
            key = f"{generation}/arrived"
            self.store.add(key, 1)
            while self.generation() == generation:
                self._check_stop(stopping)
                if int(self.store.add(key, 0)) >= self.world:
                    return generation, dist.PrefixStore(f"{generation}/", self.store)
                if time.monotonic() > deadline:
                    self.leave(generation)
                    raise CollectiveError(
                        f"learner rank {self.rank} of {self.world}: {int(self.store.add(key, 0))} of the ranks joined "
                        f"within {self.wait_sec:g} s ({JOIN_TIMEOUTS} x --collective_timeout_sec): start every "
                        f"node group, or look for the one that fails"
                    )
                self.beat()
                time.sleep(POLL_SEC)

    def _check_stop(self, stopping: Callable[[], bool]) -> None:
        why = self.store.get(_STOP).decode() if self.store.check([_STOP]) else ""
        if why == _STOPPED or stopping():
            raise NodeGroupsStopped()
        if why:
            raise RunStopped(why)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
