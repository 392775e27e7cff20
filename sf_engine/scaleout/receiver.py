"""Receiver: this run's end of its sampler nodes on a Ray cluster (--num_remote_samplers).

Runs in its own process (or in the runner in serial mode) on the CPU. It is the Ray driver of the
run's sampler actors (sf_engine.scaleout.ray_samplers): it starts them, keeps COLLECTS_IN_FLIGHT `collect`
calls open on each, writes every slot they return into a free local slot
(sf_engine.scaleout.slot_transport.unpack_slot) and hands its index to the learner through full_slots, as a
local rollout worker hands over a slot it filled: version tags intact, so lag and V-trace see the same.
It reads the learner's shared weights like the policy worker does and, when a version moved, puts
the whole set of versions into Ray's object store once and sends that one object with the next call
to every actor.

Books: per actor, in shared memory (remote_books [R, 3]: env steps it reported stepped, those placed
in local slots, those dropped; env_steps[num_workers + i]: the same stepped count), so the runner
closes the books whatever became of this process. An actor that dies (or whose node does) loses the
steps it had stepped and not returned: they are booked as dropped, Ray starts a new actor in its
place, and this receiver sends it the weights and goes on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from sf_engine.runtime.shared_buffers import WRITING
from sf_engine.runtime.slot_pool import SlotPool
from sf_engine.scaleout.slot_transport import ROWS_KEY, PayloadError, unpack_slot
from sf_engine.stats.messages import Episodes, Inference, RemoteFigures, RemoteNodes
from sf_engine.stats.stages import ReceiverStage, StageTimer

COLLECTS_IN_FLIGHT = 2  # calls open per actor: it samples the next slots while this one moves the last
REPORT_EVERY_SEC = 1.0
CLOSE_TIMEOUT_SEC = 4.0  # within the supervisor's stop timeout
RETRY_AFTER_SEC = 1.0  # a lost actor's next call, while Ray starts its successor
MAX_CONSECUTIVE_FAILURES = 3  # calls in a row raising in one actor: the receiver fails (the supervisor counts it)
STEPPED, PLACED, DROPPED = range(3)  # columns of remote_books


def remote_books_at_stop(books) -> tuple:
    """(env steps dropped with lost actors, env steps the actors stepped and did not place: on their
    nodes or in the receiver at the stop), from remote_books once every role has stopped."""
    dropped = int(books[:, DROPPED].sum())
    return dropped, int(books[:, STEPPED].sum()) - int(books[:, PLACED].sum()) - dropped


@dataclass
class RemoteSampler:
    """One sampler actor as the receiver sees it. `stepped`/`returned`: env steps the current incarnation
    reported stepped / returned in slots."""

    index: int
    actor: object
    calls: list = field(default_factory=list)  # Ray object refs of the open collect calls, oldest first
    identity: dict | None = None  # host, pid and start time of the incarnation heard from last
    stepped_before: int = 0  # env steps reported by the incarnations before this one
    stepped: int = 0
    returned: int = 0
    weights_sent: object = None  # the weights object sent last (None: the next call carries them)
    lost_at: float | None = None  # when a call to it failed, until an incarnation answers again
    retry_at: float = 0.0
    failures: int = 0  # calls in a row that raised in the actor
    figures: RemoteFigures = field(init=False)  # the cumulative ones sent in RemoteNodes

    def __post_init__(self):
        self.figures = RemoteFigures(self.index)


class Receiver:
    def __init__(self, ctx):
        from sf_engine.scaleout.ray_samplers import connect, remote_sampler_class

        cfg = ctx.cfg
        self.ctx, self.buffers, self.queues = ctx, ctx.buffers, ctx.queues
        self.pool = SlotPool(ctx.buffers, ctx.queues)
        self.num_local = cfg.sampler.num_workers
        self.books = self.buffers.remote_books
        self._close_books_of_a_predecessor()
        self.ray_processes = connect(cfg.remote.ray_address)
        actor_class = remote_sampler_class(num_cpus=cfg.remote.remote_cpus_per_sampler)
        run_key = os.path.basename(ctx.plan.paths.shm_path)[-16:]
        self.samplers = [
            RemoteSampler(
                i,
                actor_class.options(scheduling_strategy="SPREAD").remote(ctx.plan, i, run_key),
                stepped_before=int(self.books[i, STEPPED]),
            )  # a predecessor's, after a restart
            for i in range(cfg.remote.num_remote_samplers)
        ]
        self.slots_per_call = cfg.remote.remote_num_workers * cfg.sampler.worker_num_splits
        self.backlog_limit = max(cfg.slots_per_batch, 2 * len(self.samplers) * self.slots_per_call)
        self.envs_per_split = cfg.sampler.envs_per_split
        self.weights = [ctx.weights(policy) for policy in range(cfg.policies.num_acting)]
        self.local_params = [None] * len(self.weights)
        self.held_versions = np.full(len(self.weights), -1, np.int64)
        self.weights_object, self.weights_versions_sent, self.weights_bytes = None, 0, 0
        self.backlog: deque = deque()  # (sampler index, payload) fetched, waiting for a free local slot
        self.timer = StageTimer(*ReceiverStage)
        self.last_report = time.monotonic()

    def describe(self) -> str:
        return f"{len(self.samplers)} sampler actors started on the Ray cluster"

    def _close_books_of_a_predecessor(self) -> None:
        """A restarted receiver's actors are new ones (a driver's actors die with it): what the old
        ones stepped and did not place is dropped."""
        self.books[:, DROPPED] = self.books[:, STEPPED] - self.books[:, PLACED]

    # --- one unit of work -------------------------------------------------------------------------
    def step(self, timeout_sec: float) -> None:
        """Send calls where an actor has fewer than COLLECTS_IN_FLIGHT open, take in what came back
        (waits at most `timeout_sec` for it), write what fits into free slots."""
        import ray

        self.timer.start()
        self.ctx.beat()
        if not all(weights.connect("receiver", timeout_sec) for weights in self.weights):
            self.timer.lap(ReceiverStage.WAIT_REMOTE)
            return
        if len(self.backlog) < self.backlog_limit:
            self._call_actors()
        self.timer.lap(ReceiverStage.PUBLISH_WEIGHTS)
        open_calls = {call: sampler for sampler in self.samplers for call in sampler.calls}
        took = False
        if open_calls:
            wait = 0 if self.backlog else timeout_sec
            ready, _ = ray.wait(list(open_calls), num_returns=1, timeout=wait, fetch_local=False)
            if ready:  # and every other call that is done by now
                ready, _ = ray.wait(list(open_calls), num_returns=len(open_calls), timeout=0, fetch_local=False)
            self.timer.lap(ReceiverStage.WAIT_REMOTE)
            ready = set(ready)
            for sampler in self.samplers:  # each actor's calls in the order they were sent
                for call in [c for c in sampler.calls if c in ready]:
                    if call in sampler.calls:  # a loss seen in an earlier call drops the later ones
                        sampler.calls.remove(call)
                        self._take(sampler, call)
                        took = True
            self.timer.lap(ReceiverStage.FETCH)
        self._place(0 if took else timeout_sec)
        self.timer.lap(ReceiverStage.WRITE_SLOTS)
        if time.monotonic() - self.last_report > REPORT_EVERY_SEC:
            self.report()

    def _call_actors(self) -> None:
        now = time.monotonic()
        for sampler in self.samplers:
            if sampler.lost_at is not None and now < sampler.retry_at:
                continue
            while len(sampler.calls) < COLLECTS_IN_FLIGHT:
                weights = self._current_weights()
                sent = None if sampler.weights_sent is weights else weights
                sampler.calls.append(sampler.actor.collect.remote(self.slots_per_call, sent))
                sampler.weights_sent = weights

    def _current_weights(self):
        """The object holding every acting policy's newest version, put into the object store once per
        change (and only when a call is about to carry it)."""
        from sf_engine.scaleout.ray_samplers import publish_weights

        moved = [p for p, weights in enumerate(self.weights) if weights.version != self.held_versions[p]]
        if moved or self.weights_object is None:
            for policy in moved:
                weights = self.weights[policy]
                if self.local_params[policy] is None:
                    self.local_params[policy] = weights.shared.detach().to("cpu", copy=True)
                version = weights.read_into(self.local_params[policy])  # None: the learner is being replaced
                self.held_versions[policy] = self.held_versions[policy] if version is None else version
            versions = [
                (p, params.numpy(), int(v)) for p, (params, v) in enumerate(zip(self.local_params, self.held_versions))
            ]
            self.weights_object = publish_weights(versions)
            self.weights_versions_sent += 1
            self.weights_bytes = sum(params.numel() * 4 for params in self.local_params)
        return self.weights_object

    def _take(self, sampler: RemoteSampler, call) -> None:
        """One finished call: its slots into the backlog, its stats forwarded; or a failed call noted."""
        import ray

        started = time.perf_counter()
        try:
            result = ray.get(call)
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as exc:
            if "creation task" in str(exc):  # it cannot even start there: no restart will help
                raise RuntimeError(f"sampler actor {sampler.index} could not start: {str(exc).strip()}") from None
            self._call_failed(sampler, f"lost ({type(exc).__name__})")
            return
        except ray.exceptions.RayTaskError as exc:  # its envs or roles failed: start it over, a few times
            sampler.failures += 1
            if sampler.failures > MAX_CONSECUTIVE_FAILURES:
                raise RuntimeError(
                    f"sampler actor {sampler.index} failed {sampler.failures} times in a row, "
                    f"last:\n{str(exc).rstrip()}"
                ) from None
            logging.error("sampler actor %d failed:\n%s", sampler.index, str(exc).rstrip())
            ray.kill(sampler.actor, no_restart=False)
            self._call_failed(sampler, "failed (Ray starts it again)")
            return
        figures = sampler.figures
        figures.fetch_sec += time.perf_counter() - started
        self._heard_from(sampler, result["identity"])
        if result.get("needs_weights"):  # an incarnation that started after the weights went out
            sampler.weights_sent = None
        sampler.failures = 0
        sampler.stepped = result["env_steps"]
        self.books[sampler.index, STEPPED] = sampler.stepped_before + sampler.stepped
        self.buffers.env_steps[self.num_local + sampler.index] = self.books[sampler.index, STEPPED]
        figures.sample_sec += result["sample_sec"]
        for payload in result["payloads"]:
            sampler.returned += self._steps_of(payload)
            self.backlog.append((sampler.index, payload))
        self._forward(sampler, result["messages"])

    def _call_failed(self, sampler: RemoteSampler, how: str) -> None:
        """A call failed: the actor (or its node, or its results) may be gone. Its other open calls are
        given up, the next one goes out after RETRY_AFTER_SEC with the weights; the books wait for
        the reply that says whether the same incarnation answers (see _heard_from)."""
        if sampler.lost_at is None:
            sampler.lost_at = time.monotonic()
            logging.warning(
                "sampler actor %d on %s %s; its next call in %g s",
                sampler.index,
                sampler.figures.host,
                how,
                RETRY_AFTER_SEC,
            )
        sampler.calls, sampler.weights_sent = [], None
        sampler.retry_at = time.monotonic() + RETRY_AFTER_SEC

    def _heard_from(self, sampler: RemoteSampler, identity: dict) -> None:
        """A reply from the actor process `identity`. One not heard from before replaced the one before
        it (if any), whose steps stepped and not returned are dropped."""
        figures = sampler.figures
        if identity == sampler.identity:
            sampler.lost_at = None
            return
        if sampler.identity is not None:
            dropped = sampler.stepped - sampler.returned
            self.books[sampler.index, DROPPED] += dropped
            sampler.stepped_before += sampler.stepped
            sampler.stepped = sampler.returned = 0
            figures.restarts += 1
            since = sampler.lost_at if sampler.lost_at is not None else time.monotonic()
            figures.recovery_sec = round(time.monotonic() - since, 2)
            logging.warning(
                "sampler actor %d back on %s after %.1f s (pid %d); %d env steps its predecessor had not sent dropped",
                sampler.index,
                identity["host"],
                figures.recovery_sec,
                identity["pid"],
                dropped,
            )
        sampler.identity, sampler.lost_at = identity, None
        figures.host, figures.node, figures.pid = identity["host"], identity["node"], identity["pid"]

    def _steps_of(self, payload) -> int:
        try:
            return int(payload[ROWS_KEY]) * self.envs_per_split
        except (KeyError, TypeError, ValueError):
            return 0

    def _forward(self, sampler: RemoteSampler, messages: list) -> None:
        """Episodes go on to the run's stats (timed as this receiver's); the node's inference counts
        stay with its figures."""
        for message in messages:
            if isinstance(message, Episodes):
                message.stages = self.timer.report("receiver")
                self.ctx.send(message)
            elif isinstance(message, Inference):
                sampler.figures.forwards += message.forwards
                sampler.figures.forward_samples += message.samples

    def _place(self, timeout_sec: float) -> None:
        """Write the backlog's slots into free local slots and hand them to the learner; polls at most
        `timeout_sec` for a first free slot (never waits on the shared queue: see ipc)."""
        if not self.backlog:
            return
        free = self.pool.take_free(len(self.backlog), WRITING, timeout_sec)
        self.timer.lap(ReceiverStage.WAIT_SLOT)
        for slot in free:
            self._write(slot, *self.backlog.popleft())

    def _write(self, slot: int, index: int, payload: dict) -> None:
        """One payload into free slot `slot` (marked WRITING since it was taken); booked as placed once the
        learner has its index (a receiver killed in between leaves the supervisor a WRITING slot to free,
        and its successor books the steps as dropped)."""
        sampler, started = self.samplers[index], time.perf_counter()
        try:
            steps = unpack_slot(self.buffers, slot, payload, int(self.held_versions.max()), owner=WRITING)
        except PayloadError as exc:
            logging.error("sampler actor %d: a slot refused (%s); its env steps are dropped", index, exc)
            self.books[index, DROPPED] += self._steps_of(payload)
            self.pool.recycle([slot])
            return
        self.pool.hand_over(slot)
        self.books[index, PLACED] += steps
        self._book_lag(sampler, payload)
        sampler.figures.slots += 1
        sampler.figures.write_sec += time.perf_counter() - started

    def _book_lag(self, sampler: RemoteSampler, payload: dict) -> None:
        """Lag at arrival: the acting policy's version now minus the version that acted, over valid steps."""
        versions, valid = payload["policy_version"], payload["valid"]  # [T, E]; policy_id is [T + 1, E]
        policy = payload["policy_id"][:-1] if "policy_id" in payload else np.zeros(versions.shape, np.int64)
        lag = (self.held_versions[policy] - versions)[valid]
        if lag.size:
            figures = sampler.figures
            figures.lag_sum += float(lag.sum())
            figures.lag_count += int(lag.size)
            figures.lag_max = max(figures.lag_max, int(lag.max()))

    # --- reports and the end ----------------------------------------------------------------------
    def report(self) -> None:
        nodes = [
            dataclasses.replace(
                s.figures,
                stepped=int(self.books[s.index, STEPPED]),
                placed=int(self.books[s.index, PLACED]),
                dropped=int(self.books[s.index, DROPPED]),
            )
            for s in self.samplers
        ]
        self.ctx.send(RemoteNodes(self.timer.report("receiver"), nodes, self.weights_versions_sent, self.weights_bytes))
        self.last_report = time.monotonic()

    def finish(self) -> None:
        self.report()

    def close(self) -> None:
        """Every actor's node memory released, the actors ended, and this driver's Ray connection closed
        (a Ray instance it started stops with it, its workers too). Takes at most CLOSE_TIMEOUT_SEC: an actor still busy
        then is killed, and the next actor started on its node removes the memory it left."""
        import ray

        from sf_engine.scaleout.ray_samplers import disconnect

        try:
            deadline = time.monotonic() + CLOSE_TIMEOUT_SEC
            open_calls = [call for sampler in self.samplers for call in sampler.calls]
            if open_calls:  # an actor runs its calls in order: close comes after the open ones
                ray.wait(open_calls, num_returns=len(open_calls), timeout=CLOSE_TIMEOUT_SEC / 2)
            closing = [s.actor.close.remote() for s in self.samplers]
            ray.wait(closing, num_returns=len(closing), timeout=max(0.1, deadline - time.monotonic()))
            for sampler in self.samplers:
                ray.kill(sampler.actor, no_restart=True)
        finally:
            disconnect(self.ray_processes)
