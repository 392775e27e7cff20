"""The `remote` group of the configuration: sampler nodes on a Ray cluster feeding this run's learner
(sf_engine.scaleout.receiver; sf_engine.config.groups imports it into its GROUPS like every group)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sf_engine.config.fields import flag_field as _f


@dataclass(frozen=True)
class RemoteConfig:
    ray_address: Optional[str] = _f(
        None,
        "Sampler nodes on a Ray cluster (pip install 'sf_engine[ray]'). Unset: "
        "this machine only, and Ray is never imported; 'auto': the cluster "
        "already running here (`ray start` on every node); 'local': a Ray instance "
        "started on this machine for this run alone; or the head's address "
        "HOST:PORT.",
        type=str,
    )
    num_remote_samplers: int = _f(
        0,
        "Sampler actors on the Ray cluster (needs --ray_address), spread over its "
        "nodes: each runs rollout workers and a CPU policy worker on its node's shared "
        "memory and sends whole trajectory slots to this run's receiver, which hands "
        "them to the learner. A lost actor is restarted by Ray. The local rollout "
        "workers (--num_workers; 0 for none) sample beside them.",
    )
    remote_cpus_per_sampler: int = _f(
        1,
        "CPU cores Ray reserves for each sampler actor on its node; Ray places "
        "an actor only where that many are free, so a node takes as many actors "
        "as it has cores for (one actor a core: --num_remote_samplers = the "
        "cluster's cores for sampling). Raise it for envs that use threads of "
        "their own.",
    )
    remote_num_workers: int = _f(
        1,
        "Rollout workers of each sampler actor, stepped in turn with its policy worker "
        "in the actor's one process: more workers make each forward pass wider, not "
        "faster on more cores (more actors do that).",
    )

    def check(self, mode: str, pbt: bool) -> None:
        """Bad values and combinations: ValueError with one line naming the flag and the fix."""
        if self.num_remote_samplers < 0:
            raise ValueError(f"--num_remote_samplers must be >= 0 (got {self.num_remote_samplers})")
        if self.num_remote_samplers and not self.ray_address:
            raise ValueError(
                "--num_remote_samplers needs --ray_address: 'auto' for the running cluster, 'local' "
                "for a Ray instance on this machine, or the head's HOST:PORT"
            )
        if self.ray_address is not None and not self.ray_address.strip():
            raise ValueError("--ray_address is empty: give 'auto', 'local' or HOST:PORT, or leave it out")
        if self.ray_address and not self.num_remote_samplers:
            raise ValueError(
                "--ray_address without --num_remote_samplers starts no sampler node: add "
                "--num_remote_samplers N, or drop --ray_address"
            )
        if self.remote_cpus_per_sampler < 1:
            raise ValueError(f"--remote_cpus_per_sampler must be at least 1 (got {self.remote_cpus_per_sampler})")
        if self.remote_num_workers < 1:
            raise ValueError(f"--remote_num_workers must be at least 1 (got {self.remote_num_workers})")
        if self.num_remote_samplers and mode == "sync":
            raise ValueError(
                "--mode sync cannot wait for sampler nodes on other machines: use --mode async "
                "with --num_remote_samplers"
            )
        if self.num_remote_samplers and pbt:
            raise ValueError(
                "--pbt ranks policies by the episodes of the local workers only: drop --pbt or --num_remote_samplers"
            )
