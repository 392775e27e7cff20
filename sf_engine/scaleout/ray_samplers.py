"""Sampler nodes as Ray actors (the `[ray]` extra): each actor holds a SamplerNode (sf_engine.scaleout.sampler_node)
on the shared memory of the machine Ray placed it on.

The learner's side (sf_engine.scaleout.receiver) publishes each new set of versions once (`publish_weights`:
one object in Ray's object store, whatever the number of nodes) and hands its reference to every
actor with its next `collect` call, which Ray resolves on the actor's node before the call runs; the
actor publishes it into its node's shared weights, then samples. `collect` returns packed slots for
the receiver to write into the learner's free slots (sf_engine.scaleout.slot_transport.unpack_slot). A Ray
actor runs one caller's calls in submission order, so the versions arrive in the order they were
published. Ray is imported here and in the receiver only: a run without sampler nodes never imports it.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import socket
import tempfile
import time

import numpy as np

NODE_SHM_TAG = "sampler_node"  # the actors' shared-memory files: sf_engine_sampler_node_<pid>_<run>_<index>_<random>


def node_plan(plan, index: int, reconstructed: bool = False):
    """The plan of sampler actor `index` of the run `plan`: the run's env, model and slot shape, with
    --remote_num_workers rollout workers, no sampler nodes of its own, no evaluator, no core pinning,
    acting on the CPU in one policy worker (Ray gives a sampler actor no GPU) and env seeds of its own (others again
    after a restart by Ray), and no replay buffer (a node only samples: the replay is the learner's, on the head
    node).
    Built on the node, inside the actor."""
    from sf_engine.model.shape import state_size
    from sf_engine.replay.layout import REPLAY_PREFIX
    from sf_engine.runtime.shared_buffers import buffer_layout

    cfg = plan.cfg
    seed = cfg.env.seed + 7919 * (index + 1) + (104_729 * (os.getpid() % 10_007) if reconstructed else 0)
    node_cfg = dataclasses.replace(
        cfg,
        env=dataclasses.replace(cfg.env, seed=seed),
        sampler=dataclasses.replace(cfg.sampler, num_workers=cfg.remote.remote_num_workers),
        remote=dataclasses.replace(cfg.remote, ray_address=None, num_remote_samplers=0),
        parallel=dataclasses.replace(cfg.parallel, num_policy_workers=1),
        run=dataclasses.replace(cfg.run, cpu_affinity="off", eval_every_sec=0.0, device="cpu"),
    )
    layout = buffer_layout(node_cfg, plan.spec, state_size(node_cfg.model))
    layout = {name: array for name, array in layout.items() if not name.startswith(REPLAY_PREFIX)}
    return dataclasses.replace(plan, cfg=node_cfg, layout=layout, resume_from=None)


class SamplerActor:
    """The body of the Ray actor (`remote_sampler_class()` wraps it): sampler `index` of run `run_key`,
    a SamplerNode of `plan`'s node plan whose shared-memory file lives in the node's `shm_dir` (the
    temporary directory where the node has none). Removed by `close`, at the actor's exit, and, after a
    kill, by the next actor started on the node (its file name holds the pid of the actor that made it)."""

    def __init__(self, plan, index: int, run_key: str, shm_dir: str | None = None):
        from sf_engine.runtime.shared_buffers import shm_path
        from sf_engine.scaleout.sampler_node import SamplerNode

        reconstructed = _reconstructed()
        directory = shm_dir or plan.cfg.run.shm_dir
        if not os.path.isdir(directory):
            directory = tempfile.gettempdir()
        _remove_leftovers(directory)
        name = f"{NODE_SHM_TAG}_{os.getpid()}_{run_key}_{index}"
        self.node = SamplerNode(node_plan(plan, index, reconstructed), shm_path(directory, name))
        self.identity = {"host": socket.gethostname(), "node": _node_id(), "pid": os.getpid(), "started": time.time()}

    def set_weights(self, versions: list) -> int:
        """`versions`: [(policy, flat weights, version)] (publish_weights's object, resolved by Ray).
        Returns policy 0's version now held."""
        for policy, params, version in versions:
            self.node.set_weights(policy, np.asarray(params), version)
        return self.node.weights[0].version

    def collect(self, count: int, versions: list | None = None) -> dict:
        """New weights first (when given), then at least `count` full slots: {"payloads", "messages"
        (the roles' stats), "env_steps" (stepped by this actor since it started), "sample_sec",
        "identity" (host, node, pid, start time: a new one after a restart)}; with no slot and
        "needs_weights" where it holds no weights yet (started by Ray after they were sent)."""
        if versions is not None:
            self.set_weights(versions)
        if any(weights.shared is None for weights in self.node.weights):  # started after the weights went out
            return {
                "payloads": [],
                "messages": [],
                "env_steps": int(self.node.buffers.env_steps.sum()),
                "sample_sec": 0.0,
                "identity": self.identity,
                "needs_weights": True,
            }
        started = time.perf_counter()
        payloads, messages = self.node.collect(count)
        return {
            "payloads": payloads,
            "messages": messages,
            "env_steps": int(self.node.buffers.env_steps.sum()),
            "sample_sec": time.perf_counter() - started,
            "identity": self.identity,
        }

    def close(self) -> None:
        self.node.close()

    def __del__(self):
        node = getattr(self, "node", None)
        if node is not None:
            node.buffers.release()


def _remove_leftovers(directory: str) -> None:
    """The shared-memory files of this node's killed actors (of any run): their process is gone."""
    from sf_engine.runtime.shared_buffers import SHM_PREFIX

    for path in glob.glob(os.path.join(directory, f"{SHM_PREFIX}{NODE_SHM_TAG}_*")):
        pid = os.path.basename(path)[len(SHM_PREFIX + NODE_SHM_TAG) + 1 :].partition("_")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.unlink(path)
            except FileNotFoundError:  # another actor of this node removed it first
                pass


def _node_id() -> str | None:
    """The Ray node this actor runs on (its id's first 12 hex digits)."""
    import ray

    try:
        return ray.get_runtime_context().get_node_id()[:12]
    except Exception:  # not inside an actor
        return None


def _reconstructed() -> bool:
    """Whether Ray started this actor in place of a lost one."""
    import ray

    try:
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # not inside an actor (tests build SamplerActor directly)
        return False


def connect(address: str) -> list:
    """Join the Ray cluster at `address` ('auto', HOST:PORT), or start one on this machine for this
    process alone ('local': it stops with the process). Returns the processes a local instance started
    (its raylet and GCS), for `disconnect` to see ended; none for a cluster joined."""
    import psutil
    import ray

    options = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    if address != "local":
        ray.init(address=address, **options)
        return []
    before = {child.pid for child in psutil.Process().children()}
    ray.init(**options)
    return [child for child in psutil.Process().children() if child.pid not in before]


def disconnect(started: list, timeout_sec: float = 2.0) -> None:
    """Close this process's Ray connection and see every process of the local instance it started end:
    Ray stops its raylet and GCS, whose workers (the actors) exit on their own a moment later; a worker
    still running after `timeout_sec` is killed."""
    import psutil
    import ray

    family = list(started)
    for process in started:
        try:
            family += process.children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    ray.shutdown()
    _, alive = psutil.wait_procs(family, timeout=timeout_sec)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=timeout_sec)


def remote_sampler_class(num_cpus: float = 1.0, max_restarts: int = -1):
    """SamplerActor as a Ray actor class (Ray imported here): `num_cpus` reserved on its node, restarted
    by Ray when it dies (`max_restarts`, -1: always); calls in flight when it dies fail (no retries)."""
    import ray

    return ray.remote(num_cpus=num_cpus, max_restarts=max_restarts, max_task_retries=0)(SamplerActor)


def publish_weights(versions: list):
    """One object holding a set of policy versions, for every node to fetch: [(policy, weights, version)]."""
    import ray

    return ray.put([(policy, np.asarray(params, np.float32), version) for policy, params, version in versions])
