"""The run plan: everything a run is, resolved once by the main process before any child starts and
before anything on disk changes.

`build_plan(argv)` parses the command line once, probes the env once, lays the env family's defaults
under the user's flags, resolves every 'auto' (the model's shape decisions in sf_engine.model.shape, the
sampler's size by measurement in sf_engine.run.autosize, the device, the env backend, the BPTT length),
lays out the shared buffers, checks the resources, and finds the checkpoint to resume from. A bad flag
is found here, so it can never cost a file. The plan is frozen; every role is built from it (plus its
own config section), and `config.json` records its resolved config.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import sys

import psutil

from sf_engine.algo.acting import check_acting_network
from sf_engine.algo.pbt import period as pbt_period
from sf_engine.config.algorithms import algorithm_registration, check_env_for_algorithm
from sf_engine.config.checks import check_flags, check_resolved
from sf_engine.config.cli import make_config, parse_flags
from sf_engine.config.file import read_config_file
from sf_engine.config.groups import Config, ConfigError
from sf_engine.config.parallel import under_torchrun
from sf_engine.envs import EnvSpec, family, flag_defaults, probe_env_spec
from sf_engine.envs.probe import env_notes
from sf_engine.envs.registry import registered_envs, resolve_backend
from sf_engine.model.encoders import check_encoder, is_builtin, user_registration
from sf_engine.model.shape import FlagChange, changed_flags, flag_text, resolve_model_config, state_size
from sf_engine.model.user_model import BUILT_IN_NETWORK_FLAGS, check_model
from sf_engine.replay.transform import transform_class
from sf_engine.run.autosize import PROCESS_MEMORY_BYTES, count, resolve_sampler, usable_cores
from sf_engine.run.experiment import leftover_segment
from sf_engine.run.per_gpu import check_gpus, resolve_learners, resolve_policy_workers
from sf_engine.runtime.checkpoint import (
    checkpoint_dir,
    env_steps_of,
    latest_checkpoint,
    latest_valid_checkpoint,
    list_checkpoints,
)
from sf_engine.runtime.device import cpp_compiler, cpu_has_native_bf16, resolve_device
from sf_engine.runtime.run_plan import Paths, RunPlan
from sf_engine.runtime.shared_buffers import buffer_layout, required_bytes, shm_path
from sf_engine.stats.tracking import check_tracking


def saved_config(given: dict) -> dict:
    """{group: {field: value}} of the --config file among the flags `given` (parse_flags), or {}."""
    config_file = given.get("run", {}).get("config")
    return read_config_file(config_file, given.get("learner", {}).get("algo")) if config_file else {}


def _check_resolved(cfg: Config, spec: EnvSpec) -> None:
    """The resolved configuration's checks (sf_engine.config.checks), the replay transform's, and those of the env
    and the machine."""
    check_resolved(cfg)
    if cfg.uses_replay:  # the replay transform's own checks (its spec's data)
        transform_class(cfg).check(cfg)
    if cfg.sampler.envs_per_split % spec.num_agents:
        raise ConfigError(
            f"--num_envs_per_worker {cfg.sampler.num_envs_per_worker}: {cfg.env.env} has "
            f"{spec.num_agents} agents per game, each a row, and a worker's "
            f"{cfg.sampler.worker_num_splits} splits take whole games: use a multiple of "
            f"{spec.num_agents * cfg.sampler.worker_num_splits}"
        )
    if cfg.run.bf16 and cfg.run.device == "cpu" and not cpu_has_native_bf16():
        raise ConfigError(
            "--bf16: this CPU has no native bfloat16 (avx512_bf16 or AMX), so bf16 would be emulated "
            "and slower: drop --bf16"
        )
    check_gpus(cfg)
    if cfg.run.compile and cpp_compiler() is None:
        raise ConfigError(
            "--compile: torch.compile needs a C++ compiler ($CXX, else g++) and none is on PATH: install g++ (or set "
            "$CXX to yours), or pass --compile false"
        )


def build_plan(argv=None, given: dict | None = None, saved: dict | None = None) -> RunPlan:
    """The plan of `train.py argv` (sys.argv when None; `given`: argv already parsed by parse_flags, or a call's
    flags with `argv` their command line, command_line_of; `saved`: its --config file already read by
    saved_config). Bad input raises ConfigError or EnvError with one line naming the flag and the fix; nothing on
    disk is touched."""
    given = parse_flags(argv) if given is None else given
    saved = saved_config(given) if saved is None else saved
    cfg, spec = _configured(given, saved)
    try:
        cfg = dataclasses.replace(cfg, parallel=under_torchrun(cfg.parallel, os.environ))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    cfg, learner_notes = resolve_learners(cfg)
    _check_before_resolving(cfg, spec)
    # a user's module built once, before auto sizing builds the model
    user_notes = check_model(cfg, spec) + check_encoder(cfg, spec)
    check_acting_network(dataclasses.replace(cfg, model=resolve_model_config(cfg.model, spec)), spec)
    cfg, notes = _resolve(cfg, spec)
    notes = env_notes(cfg.env.env, spec) + user_notes + learner_notes + notes
    _check_resolved(cfg, spec)
    envs = registered_envs()
    if cfg.run.mode != "serial":
        _check_picklable(envs)
    experiment_dir = os.path.join(cfg.run.train_dir, cfg.run.experiment)
    paths = Paths(
        experiment_dir,
        checkpoint_dir(experiment_dir),
        os.path.join(experiment_dir, "train.log"),
        shm_path(cfg.run.shm_dir, experiment_dir),
    )
    layout = buffer_layout(cfg, spec, state_size(cfg.model))
    _check_resources(cfg, layout, paths.experiment_dir)
    resume_from, skipped, changes = _resume_point(cfg, spec, paths)
    _check_user_network_fits(cfg, spec, resume_from)
    notes += [f"warning: {reason}: using the checkpoint before it" for _, reason in skipped]
    if changes:  # resuming with other flags than the run before: the user sees which, old -> new
        notes.append(
            "resuming with changed flags: "
            + ", ".join(f"{c.flag} {flag_text(c.old)} -> {flag_text(c.new)}" for c in changes)
        )
    return RunPlan(
        cfg,
        spec,
        layout,
        paths,
        resume_from,
        tuple(list_checkpoints(paths.checkpoint_dir)),
        env_steps_of(resume_from),
        tuple(argv if argv is not None else sys.argv[1:]),
        envs,
        tuple(notes),
        user_registration(cfg.model.encoder) + algorithm_registration(cfg.learner.algo),
    )


def _configured(given: dict, saved: dict) -> tuple[Config, EnvSpec]:
    """The flags `given` over the env family's defaults, then the algorithm's for that family (its spec's), then the
    --config file's; and the env's spec, probed."""
    first = make_config(given, saved=saved)
    spec = probe_env_spec(first.env.env, first.env.env_backend, first.env.text_obs, first.env.discrete_obs)
    defaults = flag_defaults(spec) | first.algorithm.env_defaults(first.env.env, spec)
    if first.model.model:  # a user's whole network: the built-in networks' encoder and core are not its defaults
        defaults = {name: value for name, value in defaults.items() if name not in BUILT_IN_NETWORK_FLAGS}
    return make_config(given, defaults, saved), spec


def _check_before_resolving(cfg: Config, spec: EnvSpec) -> None:
    """The flags, the env against the algorithm and the policies, the tracking: one ConfigError line each."""
    check_flags(cfg)
    check_env_for_algorithm(cfg, spec)
    try:
        cfg.policies.check(spec.agents)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    check_tracking(cfg)


def _resolve(cfg: Config, spec: EnvSpec) -> tuple[Config, list]:
    """Every 'auto' of `cfg` replaced by its value; returns (config, lines explaining the choices)."""
    cfg = dataclasses.replace(
        cfg,
        env=dataclasses.replace(cfg.env, env_backend=resolve_backend(cfg.env.env, cfg.env.env_backend)),
        model=resolve_model_config(cfg.model, spec),
        run=dataclasses.replace(cfg.run, device=_resolve_device(cfg.run.device)),
    )
    if cfg.run.cpu_affinity == "auto":  # a CPU learner with cores to spare gets its own (process.pin_to_cores)
        learner_cores = (
            cfg.run.device == "cpu"
            and cfg.run.mode != "serial"
            and not cfg.run.sampling_only
            and usable_cores() > cfg.learner.learner_threads * cfg.parallel.num_learners
        )
        cfg = dataclasses.replace(
            cfg, run=dataclasses.replace(cfg.run, cpu_affinity="learner" if learner_cores else "off")
        )
    sampler, lines = resolve_sampler(cfg, spec, family(spec.family).envs_per_worker)
    cfg = dataclasses.replace(cfg, sampler=sampler)
    cfg, worker_lines = resolve_policy_workers(cfg)
    lines += worker_lines
    recurrence = sampler.rollout if cfg.learner.recurrence == "auto" else cfg.learner.recurrence
    cfg = dataclasses.replace(
        cfg,
        learner=dataclasses.replace(cfg.learner, recurrence=recurrence),
        policies=dataclasses.replace(cfg.policies, pbt_period_env_steps=pbt_period(cfg)),
    )
    notes = [f"auto sizing: {line}" for line in lines]
    if cfg.learner.learner_threads > usable_cores():
        notes.append(
            f"warning: --learner_threads {cfg.learner.learner_threads} exceeds the {usable_cores()} usable "
            f"cores: threads will contend; use --learner_threads {usable_cores()}"
        )
    return cfg, notes


def _resolve_device(device: str) -> str:
    try:
        return resolve_device(device)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _check_picklable(envs: dict) -> None:
    """register_env factories travel to the worker processes, so they must be picklable."""
    for name, make_env in envs.items():
        try:
            pickle.dumps(make_env)
        except Exception:
            raise ConfigError(
                f"--env {name}: its register_env factory cannot be sent to worker processes; "
                f"register a module-level function or class, not a lambda or closure"
            ) from None


def _check_writable(experiment_dir: str) -> None:
    """The experiment directory is (or can be made) a writable directory: the nearest part of its path
    that exists is a directory this user can write to."""
    path = os.path.abspath(experiment_dir)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise ConfigError(f"--train_dir: {path} is a file, not a directory: choose another --train_dir")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(
            f"--train_dir: {path} is not writable by this user: choose another --train_dir or fix its permissions"
        )


def _check_resources(cfg: Config, layout: dict, experiment_dir: str) -> None:
    _check_writable(experiment_dir)
    if not os.path.isdir(cfg.run.shm_dir):
        raise ConfigError(f"--shm_dir {cfg.run.shm_dir} does not exist; point it at a tmpfs such as /dev/shm")
    stat = os.statvfs(cfg.run.shm_dir)
    leftover = leftover_segment(experiment_dir, cfg.run.shm_dir)  # removed once the experiment is locked
    available = stat.f_bavail * stat.f_frsize + (os.path.getsize(leftover) if leftover else 0)
    needed = required_bytes(layout)
    if needed > available:
        raise ConfigError(
            f"shared buffers need {needed / 2**20:,.0f} MiB but {cfg.run.shm_dir} has "
            f"{available / 2**20:,.0f} MiB free: lower "
            f"{'--replay_size' if cfg.uses_replay else '--num_envs_per_worker or --batch_size'}, "
            f"or choose a larger --shm_dir"
        )
    processes = cfg.sampler.num_workers + 3
    memory = needed + processes * PROCESS_MEMORY_BYTES
    free = psutil.virtual_memory().available
    if memory > free:
        raise ConfigError(
            f"this run needs about {memory / 2**20:,.0f} MiB of memory (buffers and {processes} "
            f"processes) but {free / 2**20:,.0f} MiB are available: lower "
            f"{'--replay_size, ' if cfg.uses_replay else ''}--num_workers or --num_envs_per_worker"
        )


def _resume_point(cfg: Config, spec: EnvSpec, paths: Paths) -> tuple:
    """(the checkpoint to resume from or None, [(skipped path, reason)], [FlagChange] of the flags that
    differ from the run before). A resumed run must have the env and model it was trained with; other
    flags may change; --restart resumes nothing (the experiment is cleared later)."""
    if cfg.run.restart or not latest_checkpoint(paths.checkpoint_dir):
        return None, [], []
    path, changes = os.path.join(paths.experiment_dir, "config.json"), []
    if os.path.exists(path):
        try:
            with open(path) as f:
                saved = json.load(f)
            changed = changed_flags(saved, cfg, spec)
            changes = _changed_settings(saved, cfg)
        except (OSError, ValueError, AttributeError) as exc:
            raise ConfigError(
                f"--experiment {cfg.run.experiment}: {path} is unreadable ({exc}); pass --restart to "
                f"start over or choose another --experiment"
            ) from None
        if changed:
            raise ConfigError(
                f"--experiment {cfg.run.experiment} holds a run of another env or model "
                f"({'; '.join(map(str, changed))}): choose another --experiment for this one, or pass --restart "
                f"to delete that run's checkpoints and start over"
            )
    resume_from, skipped = latest_valid_checkpoint(paths.checkpoint_dir, load=True)
    if resume_from is None:
        raise ConfigError(
            f"--experiment {cfg.run.experiment}: no usable checkpoint ({skipped[-1][1]}); pass --restart to start over"
        )
    return resume_from, skipped, changes


def _check_user_network_fits(cfg: Config, spec: EnvSpec, resume_from: str | None) -> None:
    """A user's encoder or whole network (--model) builds what its file says now: where that was edited since the
    checkpoint to resume was written, its weights no longer fit the model (a built-in encoder's do whenever the
    model flags are the same). One ConfigError line naming the first weight that differs."""
    if resume_from is None or (is_builtin(cfg.model.encoder) and not cfg.model.model):
        return
    flag = f"--model {cfg.model.model}" if cfg.model.model else f"--encoder {cfg.model.encoder}"
    from sf_engine.algo.acting import build_policy
    from sf_engine.runtime.checkpoint import load_checkpoint, policy_states

    saved = policy_states(load_checkpoint(resume_from))[0].get("model", {})
    expected = build_policy(spec, cfg).state_dict()
    for name in dict.fromkeys([*expected, *saved]):  # the model's weights, then any the checkpoint has beyond them
        then, now = (list(d[name].shape) if name in d else "absent" for d in (saved, expected))
        if then != now:
            raise ConfigError(
                f"{flag}: its module is not the one of the checkpoint to resume, "
                f"{os.path.basename(resume_from)} ({name} is {then} in it, {now} now): restore the module, pass "
                f"--restart to start over or choose another --experiment"
            )


def _changed_settings(saved: dict, cfg: Config) -> list[FlagChange]:
    """Every flag whose value in `saved` (config.json of the run before) differs from the resolved `cfg`
    (an 'auto' that resolves as before is no change; budgets count). Settings config.json does not hold
    (a version before them) are left out."""
    new = json.loads(json.dumps(cfg.to_dict()))  # tuples as lists, as config.json holds them
    return [
        FlagChange(f"--{name}", saved[group][name], value)
        for group, fields in new.items()
        for name, value in fields.items()
        if isinstance(saved.get(group), dict) and name in saved[group] and saved[group][name] != value
    ]


def log_plan(plan: RunPlan) -> None:
    """The plan's notes and its one-line description, to the run's log."""
    for note in plan.notes:
        (logging.warning if note.startswith("warning: ") else logging.info)(note.removeprefix("warning: "))
    cfg = plan.cfg
    if plan.resume_from:
        logging.info(
            "resuming experiment %s from %s (%s env steps; --restart starts over)",
            cfg.run.experiment,
            os.path.basename(plan.resume_from),
            f"{plan.env_steps_base:,}",
        )
    logging.info(
        "experiment %s: %s on %s, mode %s, device %s, %s x %s, %s of %s x %s",
        cfg.run.experiment,
        cfg.env.env,
        cfg.env.env_backend,
        cfg.run.mode,
        cfg.run.device,
        count(cfg.sampler.num_workers, "worker"),
        count(cfg.sampler.num_envs_per_worker, "env"),
        count(cfg.num_slots, "slot"),
        count(cfg.sampler.rollout, "step"),
        count(cfg.sampler.envs_per_split, "env"),
    )
    remote = cfg.remote
    if remote.num_remote_samplers:
        logging.info(
            "sampler nodes: %s (--ray_address %s), each %s x %s and a policy worker on %s",
            count(remote.num_remote_samplers, "Ray actor"),
            remote.ray_address,
            count(remote.remote_num_workers, "rollout worker"),
            count(cfg.sampler.num_envs_per_worker, "env"),
            count(remote.remote_cpus_per_sampler, "reserved core"),
        )
    idle = cfg.sampler.total_splits - cfg.slots_per_batch % max(1, cfg.sampler.total_splits)
    if cfg.run.mode == "sync" and idle < cfg.sampler.total_splits:
        logging.info(
            "sync mode: %d of %d env groups wait each round for a slot; a training batch of a multiple "
            "of %d slots keeps them all busy",
            idle,
            cfg.sampler.total_splits,
            cfg.sampler.total_splits,
        )
