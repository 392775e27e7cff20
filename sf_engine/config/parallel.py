"""The `parallel` group of the configuration: several learner processes (ranks) of one policy, data-parallel
(sf_engine.runtime.ranks; sf_engine.config.groups imports it into its GROUPS like every group)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sf_engine.config.algorithms import built_in_algorithms
from sf_engine.config.fields import flag_field as _f
from sf_engine.config.fields import int_or_auto


@dataclass(frozen=True)
class ParallelConfig:
    num_learners: int | str = _f(
        1,
        "Learner processes (ranks) training the one policy, data-parallel: each takes its share of every training "
        "batch (its trajectory slots; with a replay buffer, a buffer of its own holding 1/N of --replay_size, filled "
        "with its share of the slots) and trains on minibatches of --batch_size / N samples (--batch_per_learner: "
        "--batch_size each); the ranks' gradients are averaged before every optimizer step (torch.distributed: NCCL "
        "between GPUs, gloo on the CPU), so that the run learns as with one learner and every rank holds the same "
        "weights (compared at every publication). Rank 0 publishes the weights, writes the checkpoints and reports; "
        "with --device cuda rank r learns on GPU r. For the algorithms built for it ("
        + ", ".join(name for name, spec in built_in_algorithms().items() if spec.data_parallel)
        + ", or a user's whose spec says data_parallel) in --mode async or sync. A rank that dies restarts them all "
        "from the training state kept. 1: one learner; 'auto': one per visible GPU with --device cuda (or auto "
        "finding GPUs) where the run can have several ranks, else 1.",
        type=int_or_auto,
    )
    batch_per_learner: bool = _f(
        False,
        "With --num_learners N: --batch_size is each rank's minibatch, so the run's minibatch (and training batch) is "
        "N times as large and each optimizer step averages N times the samples (fewer steps per env step: raise "
        "--learning_rate yourself if you want the linear scaling rule). false: --batch_size is the run's minibatch, "
        "each rank takes 1/N of it, and the run learns as with one learner.",
    )
    num_policy_workers: int | str = _f(
        "auto",
        "Policy-worker processes, each batching the forward passes of its share of the rollout workers (worker w "
        "is served by policy worker w mod N); with --device cuda policy worker k acts on GPU k, so that inference "
        "scales with the GPUs. 'auto': one per visible GPU with --device cuda (at most one per rollout worker), "
        "else 1.",
        type=int_or_auto,
    )
    learner_devices: str = _f(
        "",
        "With --num_learners N: each rank's device, comma-separated, rank r the r-th (cuda:0,cuda:2,... with --device "
        "cuda, on GPUs of this machine; cpu with --device cpu). Ranks that share a GPU (cuda:0,cuda:0) join over gloo, "
        "their collectives through the host's memory (NCCL puts one rank on a GPU): for trying ranks on one GPU, "
        "not for speed. Empty: rank r on GPU r with --device cuda, on the CPU otherwise.",
    )
    collective_timeout_sec: float = _f(
        30.0,
        "With --num_learners > 1, the longest a rank waits for the others in one collective (their joining at the "
        "start included): a rank that died or hangs ends the wait with one line naming the operation, and the "
        "ranks are restarted. Keep it below --stuck_timeout_sec: a rank waiting in a collective does not beat.",
    )

    dist_init: str = _f(
        "",
        "Learners on several machines: where the learner ranks of every node group meet. A node group is one "
        "train.py on its machine (its samplers, policy workers, its --num_learners ranks and its own experiment "
        "directory); the ranks of all of them (--dist_world x --num_learners, node group g's local rank r being "
        "rank g x --num_learners + r) average their gradients, so every machine's ranks hold the same weights. "
        "'tcp://HOST:PORT': node group 0's train.py serves the rendezvous at that address (HOST: its address as the "
        "others reach it); 'env://': torchrun's (MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE of a torchrun "
        "--nproc_per_node 1; the default under torchrun). Each node group's batch is a run's batch, so an optimizer "
        "step averages --dist_world times the samples; the env-step budget counts the env steps of all of them, and "
        "a stop of one (its time budget, Ctrl-C) stops them all. Empty: one machine.",
    )
    dist_rank: int = _f(0, "With --dist_init tcp://...: this node group's index, 0 to --dist_world - 1 (0 serves it).")
    dist_world: int = _f(1, "With --dist_init tcp://...: the number of node groups (machines) whose learners train.")

    def learner_device(self, device: str, rank: int) -> str:
        """The device of learner rank `rank` of a run on `device` (resolved: 'cpu' or 'cuda'): its entry in
        --learner_devices, else GPU `rank` on CUDA, the CPU otherwise."""
        if self.learner_devices:
            return self.learner_devices.split(",")[rank].strip()
        return device_of(device, rank)

    def shares_gpus(self, device: str) -> bool:
        """Whether two learner ranks of a run on `device` (resolved) share a GPU (--learner_devices names one twice)."""
        devices = [self.learner_device(device, rank) for rank in range(self.num_learners)]
        return device == "cuda" and len(set(devices)) < len(devices)

    def collective_backend(self, device: str) -> str:
        """The backend of the learner ranks' collectives in a run on `device` (resolved: 'cpu' or 'cuda'): NCCL where
        each rank has a GPU of its own, gloo on the CPU and where ranks share a GPU."""
        return "nccl" if device == "cuda" and not self.shares_gpus(device) else "gloo"

    @property
    def learner_world(self) -> int:
        """The learner ranks of every node group (resolved --num_learners x --dist_world; 1: one learner alone)."""
        return self.num_learners * self.dist_world

    def check(self) -> None:
        """Bad values: ValueError with one line naming the flag and the fix."""
        if self.num_learners != "auto" and self.num_learners < 1:
            raise ValueError(f"--num_learners must be at least 1 (got {self.num_learners})")
        if self.num_policy_workers != "auto" and self.num_policy_workers < 1:
            raise ValueError(f"--num_policy_workers must be at least 1 (got {self.num_policy_workers})")
        if self.dist_world < 1 or not 0 <= self.dist_rank < self.dist_world:
            raise ValueError(
                f"--dist_rank must be one of 0 to --dist_world - 1 and --dist_world at least 1 (got --dist_rank "
                f"{self.dist_rank}, --dist_world {self.dist_world})"
            )
        if self.dist_init != "env://":
            node_groups(self, {})  # the form of a tcp:// address
        if self.dist_world > 1 and not self.dist_init:
            raise ValueError(
                f"--dist_world {self.dist_world}: the node groups meet at --dist_init tcp://HOST:PORT (node group "
                f"0's address); give it, or run under torchrun"
            )
        if not self.collective_timeout_sec > 0:
            raise ValueError(f"--collective_timeout_sec must be > 0 seconds (got {self.collective_timeout_sec})")


def device_of(device: str, index: int) -> str:
    """The device of the `index`-th process of a kind (learner rank, policy worker) in a run on `device` (resolved:
    'cpu' or 'cuda'): GPU `index` on CUDA, where each has its own; the CPU, shared by all, otherwise."""
    return f"cuda:{index}" if device == "cuda" else device


NODE_SEED_STRIDE = 1_000_033  # node group g's envs and replay sampling: --seed + g x this, apart from the others'


def node_seed(parallel: ParallelConfig, seed: int) -> int:
    """The seed of this node group's envs and replay sampling (node group 0's is --seed: one machine's runs as
    before), so that no two node groups step the same episodes."""
    return seed + parallel.dist_rank * NODE_SEED_STRIDE


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of 'tcp://HOST:PORT', else None."""
    host, colon, port = address.removeprefix("tcp://").rpartition(":")
    if not address.startswith("tcp://") or not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class NodeGroups:
    """Where the learner ranks of several node groups meet (ParallelConfig.node_groups): the rendezvous's address,
    this node group's index and their number, whether this node group's main process serves the rendezvous (node
    group 0, unless torchrun's agent does), and a prefix of its keys (under torchrun, its job's)."""

    host: str
    port: int
    node: int
    nodes: int
    serves: bool
    prefix: str = "sf_engine"


def under_torchrun(parallel: ParallelConfig, environ) -> ParallelConfig:
    """`parallel` with torchrun's node groups (--dist_init env://, --dist_rank and --dist_world from its environment
    `environ`) where train.py runs under torchrun and --dist_init does not say otherwise. ValueError of one line."""
    groups = node_groups(parallel, environ)
    if groups is None or parallel.dist_init.startswith("tcp://"):
        return parallel
    return dataclasses.replace(parallel, dist_init="env://", dist_rank=groups.node, dist_world=groups.nodes)


def node_groups(parallel: ParallelConfig, environ) -> NodeGroups | None:
    """The node groups of `parallel`'s --dist_init (torchrun's environment `environ` for env://, the default under
    torchrun), or None on one machine. ValueError of one line where torchrun's environment does not fit."""
    init = parallel.dist_init or ("env://" if "TORCHELASTIC_RUN_ID" in environ else "")
    if not init:
        return None
    if init != "env://":
        if _host_port(init) is None:
            raise ValueError(f"--dist_init must be tcp://HOST:PORT or env:// (got {init!r})")
        host, port = _host_port(init)
        return NodeGroups(host, port, parallel.dist_rank, parallel.dist_world, serves=parallel.dist_rank == 0)
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE") if name not in environ]
    if missing:
        raise ValueError(
            f"--dist_init env://: {', '.join(missing)} not set (torchrun sets them): run train.py under torchrun, "
            f"or give --dist_init tcp://HOST:PORT --dist_rank R --dist_world N"
        )
    if environ.get("LOCAL_WORLD_SIZE", "1") != "1":
        raise ValueError(
            f"torchrun --nproc_per_node {environ['LOCAL_WORLD_SIZE']}: each node's one train.py starts its "
            f"--num_learners learner ranks itself; run torchrun --nproc_per_node 1"
        )
    node, agent = int(environ["RANK"]), environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    # the agent's store outlives its workers' restarts (each node's own count): one prefix for the whole job, where a
    # rank's claim in a generation (sf_engine.runtime.rendezvous) makes an earlier attempt's keys harmless
    prefix = f"sf_engine/{environ.get('TORCHELASTIC_RUN_ID', '')}"
    return NodeGroups(
        environ["MASTER_ADDR"],
        int(environ["MASTER_PORT"]),
        node,
        int(environ["WORLD_SIZE"]),
        node == 0 and not agent,
        prefix,
    )
