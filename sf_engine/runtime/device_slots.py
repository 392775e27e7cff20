"""Device mode's observations in the device's memory: on a GPU, the observations a device sampler writes into its
trajectory slots, and those the replay buffer keeps (DQN, SAC, TD3), never pass through the host: the sampler writes
them there, the learner gathers its batches there and copies slots into its replay buffer there.

The main process makes these arrays once per run and holds them while the run lives, as it holds the run's shared
memory, so a sampler or a learner that dies takes none of it along (a restarted learner finds the replay buffer its
predecessor filled); every process of the run gets them with its queues (through CUDA IPC, as the process starts).
On the CPU they stay in the run's shared memory: the samplers and the learner then see those arrays as tensors, or
NumPy arrays, through the same code.

torch is imported where the arrays are made: the main process of a run without them needs no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

DEVICE_OBS_ROLES = ("device_sampler", "learner")  # the processes that read or write them


@dataclass
class DeviceObs:
    """A run's observations in its device's memory: the slots' [slots, rollout + 1, envs per split, *shape] and,
    with a replay buffer, the buffer's [columns, rollout + 1, *shape] (None without one)."""

    slots: object
    replay: object = None


def keeps_obs_on_device(cfg) -> bool:
    """Whether a run's observations live in its device's memory: a device env on a GPU."""
    return cfg.env.env_backend == "device" and cfg.run.device.startswith("cuda")


def make_device_obs(plan) -> DeviceObs | None:
    """The observations of the run's slots (and replay buffer) in the memory of its device, zeroed, where
    keeps_obs_on_device (else None: the shared memory's)."""
    if not keeps_obs_on_device(plan.cfg):
        return None
    import torch
    import torch.multiprocessing  # noqa: F401  its reductions send a CUDA tensor to a child as a CUDA IPC handle

    from sf_engine.replay.layout import replay_prefix
    from sf_engine.runtime.transfer import torch_dtype

    def zeros(name: str):
        shape, dtype = plan.layout[name]
        return torch.zeros(shape, dtype=torch_dtype(dtype), device=plan.cfg.run.device)

    name = f"obs.{plan.spec.obs[0][0]}"
    return DeviceObs(zeros(name), zeros(replay_prefix(0) + name) if plan.cfg.uses_replay else None)


def slot_obs_arrays(ctx) -> dict:
    """key -> the slot observations of the run of `ctx` (a RoleContext): the device's array (a tensor), or the shared
    memory's (NumPy arrays)."""
    device_obs = ctx.queues.device_obs
    return ctx.buffers.obs if device_obs is None else {ctx.plan.spec.obs[0][0]: device_obs.slots}


def settle(array) -> None:
    """The copies queued into or out of `array` done, where it is a GPU's, before another process uses it (a slot
    handed over or given back): nothing orders one process's GPU work after another's."""
    import torch

    if isinstance(array, torch.Tensor) and array.is_cuda:
        torch.cuda.current_stream(array.device).synchronize()


def queues_for(role: str, queues):
    """The queues a process of `role` starts with: without the device's arrays where it has no use for them (taking
    them would open a CUDA context there)."""
    if queues.device_obs is None or role in DEVICE_OBS_ROLES:
        return queues
    return dataclasses.replace(queues, device_obs=None)
