"""Device mode's slot observations in the device's memory: on a GPU, the observations a device sampler writes into its
trajectory slots and the learner trains on never pass through the host.

The main process makes that array once per run and holds it while the run lives, as it holds the run's shared memory,
so a sampler or a learner that dies takes none of it along; every process of the run gets it with its queues (through
CUDA IPC, as the process starts). On the CPU, and for an algorithm that trains from a replay buffer (which takes its
rows from the host's slots), the slots' observations stay in the run's shared memory: the samplers and the learner
then see that array as a tensor, through the same code.

torch is imported where the array is made: the main process of a run without one needs no torch.
"""

from __future__ import annotations


def keeps_obs_on_device(cfg) -> bool:
    """Whether a run's slot observations live in its device's memory: a device env on a GPU, on-policy."""
    return cfg.env.env_backend == "device" and cfg.run.device.startswith("cuda") and not cfg.uses_replay


def make_device_obs(plan):
    """The slot observations [slots, rollout + 1, envs per split, *shape] in the memory of the run's device, zeroed,
    where keeps_obs_on_device (else None: the shared memory's)."""
    if not keeps_obs_on_device(plan.cfg):
        return None
    import torch
    import torch.multiprocessing  # noqa: F401  its reductions send a CUDA tensor to a child as a CUDA IPC handle

    from sf_engine.runtime.transfer import torch_dtype

    shape, dtype = plan.layout[f"obs.{plan.spec.obs[0][0]}"]
    return torch.zeros(shape, dtype=torch_dtype(dtype), device=plan.cfg.run.device)


def slot_obs(buffers, queues, key: str):
    """The run's slot observations of `key` as a tensor: the device's array (queues.device_obs), or a view of the
    shared memory's."""
    import torch

    return queues.device_obs if queues.device_obs is not None else torch.from_numpy(buffers.obs[key])
