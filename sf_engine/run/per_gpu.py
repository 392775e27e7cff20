"""What runs on each GPU: --num_learners auto (a learner rank per GPU) and --num_policy_workers auto (a policy worker
per GPU), resolved while the main process builds the run plan, and the check that each has a GPU of its own."""

from __future__ import annotations

import dataclasses

from sf_engine.config.checks import check_learner_ranks
from sf_engine.config.groups import Config, ConfigError
from sf_engine.envs.registry import resolve_backend
from sf_engine.runtime.device import cuda_device_count, resolve_device


def resolve_learners(cfg: Config) -> tuple[Config, list]:
    """--num_learners auto: a learner rank per visible GPU where the run is on CUDA and can have several ranks (the
    checks of several ranks pass), else 1; returns (config, the line saying why)."""
    if cfg.parallel.num_learners != "auto":
        return cfg, []

    def with_ranks(ranks: int) -> Config:
        return dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, num_learners=ranks))

    try:
        device = resolve_device(cfg.run.device)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    gpus = cuda_device_count() if device == "cuda" else 0
    why = f"{gpus} GPU" if gpus == 1 else f"{gpus} GPUs" if gpus else "no GPU in use"
    if gpus > 1 and resolve_backend(cfg.env.env, cfg.env.env_backend) == "device":
        why = "a device env is sampled on its one learner's device"
    elif gpus > 1:
        try:
            check_learner_ranks(with_ranks(gpus))
            return with_ranks(gpus), [f"auto sizing: --num_learners auto = {gpus}: a learner rank per GPU"]
        except ConfigError as exc:
            why = str(exc)
    return with_ranks(1), [f"auto sizing: --num_learners auto = 1: {why}"]


def resolve_policy_workers(cfg: Config) -> tuple[Config, list]:
    """--num_policy_workers auto: one per visible GPU with --device cuda (at most one per rollout worker) where the
    run has rollout workers in processes of their own (not in serial mode, device mode or --deterministic), else 1."""
    if cfg.parallel.num_policy_workers != "auto":
        return cfg, []
    acting = cfg.run.mode != "serial" and cfg.env.env_backend != "device" and not cfg.run.deterministic
    gpus = cuda_device_count() if cfg.run.device == "cuda" and acting else 0
    workers = max(1, min(gpus, cfg.sampler.num_workers))
    cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, num_policy_workers=workers))
    line = f"--num_policy_workers auto = {workers}: one per GPU, each serving 1/{workers} of the rollout workers"
    return cfg, [line] if workers > 1 else []


def check_gpus(cfg: Config) -> None:
    """With --device cuda, one GPU per learner rank and per policy worker: more than are visible is one line; so is
    a --learner_devices that does not name one device per rank, each of the run's kind (a visible GPU; one each with
    node groups, whose ranks meet over NCCL)."""
    _check_learner_devices(cfg)
    for flag, processes, each in (
        ("--num_learners", cfg.parallel.num_learners, "learner rank"),
        ("--num_policy_workers", cfg.parallel.num_policy_workers, "policy worker"),
    ):
        named = flag == "--num_learners" and cfg.parallel.learner_devices  # checked above, GPU by GPU
        if processes > 1 and cfg.run.device == "cuda" and processes > cuda_device_count() and not named:
            raise ConfigError(
                f"{flag} {processes} with --device cuda: one GPU per {each}, and {cuda_device_count()} are visible: "
                f"lower {flag}"
            )


def _check_learner_devices(cfg: Config) -> None:
    given, ranks = cfg.parallel.learner_devices, cfg.parallel.num_learners
    if not given:
        return
    devices = [device.strip() for device in given.split(",")]
    flag = f"--learner_devices {given}"
    if len(devices) != ranks:
        raise ConfigError(f"{flag}: {len(devices)} devices for --num_learners {ranks}: give one per rank")
    if cfg.run.device != "cuda":
        if any(device != "cpu" for device in devices):
            raise ConfigError(f"{flag}: the run is on the CPU (--device {cfg.run.device}): give cpu for each rank")
        return
    visible = cuda_device_count()
    gpus = [device.removeprefix("cuda:") for device in devices]
    if not all(
        device.startswith("cuda:") and gpu.isdigit() and int(gpu) < visible for device, gpu in zip(devices, gpus)
    ):
        raise ConfigError(f"{flag}: with --device cuda each rank needs one of the {visible} visible GPUs, as cuda:N")
    if cfg.parallel.shares_gpus(cfg.run.device) and cfg.parallel.dist_world > 1:
        raise ConfigError(
            f"{flag} with --dist_world {cfg.parallel.dist_world}: the node groups' ranks meet over NCCL, one rank on "
            f"a GPU; give each rank a GPU of its own"
        )
