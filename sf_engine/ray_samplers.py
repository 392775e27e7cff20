"""Sampler nodes as Ray actors (the `[ray]` extra): each actor holds a SamplerNode (sf_engine.sampler_node)
on the shared memory of the machine Ray placed it on.

The learner's side publishes each new version once (`publish_weights`: one object in Ray's object
store, whatever the number of nodes) and hands its reference to every actor, which fetches it and
publishes it into its node's shared weights. Each actor's `collect` returns packed slots for a
receiver to write into the learner's free slots (sf_engine.slot_transport.unpack_slot). Ray is
imported here only: a run that does not use sampler nodes never imports it.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np


class SamplerActor:
    """The body of the Ray actor (`remote_sampler_class()` wraps it): a SamplerNode of `plan` whose
    shared-memory file lives in the node's `shm_dir`, removed by `close` (and at the actor's exit)."""

    def __init__(self, plan, shm_dir: str | None = None):
        from sf_engine.sampler_node import SamplerNode
        from sf_engine.shared_buffers import shm_path

        directory = shm_dir or plan.cfg.run.shm_dir
        if not os.path.isdir(directory):
            directory = tempfile.gettempdir()
        self.node = SamplerNode(plan, shm_path(directory, "sampler_node"))

    def set_weights(self, versions: list) -> int:
        """`versions`: [(policy, flat weights, version)], fetched by Ray from the object store (one
        object per version, shared by every node; a Ray actor runs one caller's calls in order, so the
        versions arrive in the order they were published). Returns policy 0's version now held."""
        for policy, params, version in versions:
            self.node.set_weights(policy, np.asarray(params), version)
        return self.node.weights[0].version

    def collect(self, count: int) -> tuple:
        """(packed slots, stats messages): see SamplerNode.collect."""
        return self.node.collect(count)

    def close(self) -> None:
        self.node.close()

    def __del__(self):
        node = getattr(self, "node", None)
        if node is not None:
            node.buffers.release()


def remote_sampler_class(num_cpus: float = 1.0):
    """SamplerActor as a Ray actor class (Ray imported here)."""
    import ray

    return ray.remote(num_cpus=num_cpus)(SamplerActor)


def publish_weights(policy: int, params, version: int):
    """One object holding a policy's version, for every node to fetch: [(policy, weights, version)]."""
    import ray

    return ray.put([(policy, np.asarray(params, np.float32), version)])
