"""Runner (the main process): validates the config, allocates shared memory and queues, starts and
stops the roles, aggregates stats, and decides when the run ends.

In async and sync modes every role is a child process started through a forkserver that preloads
torch and the env libraries once, while the runner probes the env (start-up is part of the user's
wait). In serial mode the same role classes are stepped in turn in this process.
"""
from __future__ import annotations

import dataclasses
import fcntl
import glob
import json
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import pickle
import shutil
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import psutil

from envs import ENVS_PER_WORKER_HINT, FAMILY_DEFAULTS, EnvError, probe_env_spec
from envs.partially_observed import ENV_DEFAULTS
from envs.registry import may_use_envpool, registered_envs
from sf_engine.autosize import resolve_auto, usable_cores
from sf_engine.checkpoint import (checkpoint_dir, env_steps_of, latest_checkpoint, latest_valid_checkpoint,
                                  remove_temporary_files)
from sf_engine.config import Config, ConfigError, parse_config
from sf_engine.device import cuda_device_count
from sf_engine.ipc import drain, make_lifeline, make_queues, new_policy_requests
from sf_engine.shared_buffers import SharedBuffers, buffer_layout, heartbeat_index, required_bytes, shm_path
from sf_engine.stats import RunStats, write_json_atomic

STOP_TIMEOUT_SEC = 9.0  # every child stops within this (the learner saves first), or is killed
STARTUP_GRACE_SEC = 120.0  # a process that has not beaten yet is stuck only after this (or the timeout)
RESTART_WINDOW_SEC = 300.0  # --max_worker_restarts counts restarts within this window
PROCESS_MEMORY_BYTES = 400 * 2**20  # resident memory of one process (torch, envs) besides the buffers
_OWN_FILES = ("config.json", "summary.json", "processes.json", "train.log", "events.out.tfevents.*")


def start_forkserver(cfg: Config):
    """Start the forkserver now so its preloading (torch, envpool) overlaps the runner's own set-up.
    torch._dynamo is what torch.optim imports on first use (about 1 s): preloaded once here.
    Returns None in serial mode (no child processes)."""
    if cfg.run.mode == "serial":
        return None
    ctx = multiprocessing.get_context("forkserver")
    modules = ["envpool"] if may_use_envpool(cfg.env.env, cfg.env.env_backend) else []
    ctx.set_forkserver_preload(modules + ["gymnasium", "torch", "torch._dynamo", "sf_engine.rollout_worker",
                                          "sf_engine.policy_worker", "sf_engine.learner", "sf_engine.evaluator"])
    multiprocessing.forkserver.ensure_running()
    return ctx


def _lock_experiment(exp_dir: str, experiment: str):
    """One run per experiment at a time (they would share checkpoints and the shared-memory file)."""
    os.makedirs(checkpoint_dir(exp_dir), exist_ok=True)
    lock = open(os.path.join(exp_dir, ".lock"), "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ConfigError(f"--experiment {experiment} is already running in another process: "
                          f"wait for it or choose another --experiment") from None
    return lock


def _prepare_experiment_dir(cfg: Config) -> str:
    """--restart clears the experiment; otherwise a resumed run must have the same env and model."""
    exp_dir = cfg.experiment_dir
    if cfg.run.restart:
        shutil.rmtree(checkpoint_dir(exp_dir), ignore_errors=True)
        os.makedirs(checkpoint_dir(exp_dir), exist_ok=True)
        for pattern in _OWN_FILES:
            for path in glob.glob(os.path.join(exp_dir, pattern)):
                os.unlink(path)
    saved = os.path.join(exp_dir, "config.json")
    if os.path.exists(saved) and latest_checkpoint(checkpoint_dir(exp_dir)):
        with open(saved) as f:
            old = json.load(f)
        changed = [f"--{name}" for name, value in old.get("model", {}).items()
                   if getattr(cfg.model, name, value) != value]
        if old.get("env", {}).get("env") != cfg.env.env:
            changed.insert(0, "--env")
        if changed:
            raise ConfigError(f"--experiment {cfg.run.experiment} was trained with other {', '.join(changed)}: "
                              f"pass --restart to start over or choose another --experiment")
    return exp_dir


def _check_resources(cfg: Config, layout: dict, path: str) -> None:
    if cfg.run.device == "cuda" and cuda_device_count() == 0:
        raise ConfigError("--device cuda: no CUDA GPU is available here; use --device cpu (or auto)")
    if not os.path.isdir(cfg.run.shm_dir):
        raise ConfigError(f"--shm_dir {cfg.run.shm_dir} does not exist; point it at a tmpfs such as /dev/shm")
    stat = os.statvfs(cfg.run.shm_dir)
    available = stat.f_bavail * stat.f_frsize + (os.path.getsize(path) if os.path.exists(path) else 0)
    needed = required_bytes(layout)
    if needed > available:
        raise ConfigError(f"shared buffers need {needed / 2**20:,.0f} MiB but {cfg.run.shm_dir} has "
                          f"{available / 2**20:,.0f} MiB free: lower --num_envs_per_worker or --batch_size, "
                          f"or choose a larger --shm_dir")
    processes = cfg.sampler.num_workers + 3
    memory = needed + processes * PROCESS_MEMORY_BYTES
    free = psutil.virtual_memory().available
    if memory > free:
        raise ConfigError(f"this run needs about {memory / 2**20:,.0f} MiB of memory (buffers and {processes} "
                          f"processes) but {free / 2**20:,.0f} MiB are available: lower --num_workers or "
                          f"--num_envs_per_worker")


def _kill_leftovers(exp_dir: str) -> list:
    """Processes of a dead run of this experiment (its runner was killed) that are still alive:
    recognised by pid and start time in its processes.json, and killed. Returns what was done."""
    path = os.path.join(exp_dir, "processes.json")
    done = []
    try:
        with open(path) as f:
            rows = json.load(f)["processes"]
    except (OSError, ValueError, KeyError):
        return done
    for row in rows:
        if row.get("pid") == os.getpid() or "create_time" not in row:
            continue
        try:
            process = psutil.Process(row["pid"])
            if abs(process.create_time() - row["create_time"]) < 1e-3:
                process.kill()
                done.append(f"killed {row['role']} {row['index']} (pid {row['pid']}) left by a previous run")
        except psutil.Error:
            pass
    return done


def _setup_logging(log_path: str) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.INFO)
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(logging.Formatter("%(message)s"))
    logfile = logging.FileHandler(log_path)
    logfile.setFormatter(logging.Formatter("%(asctime)s runner %(levelname)s %(message)s"))
    root.addHandler(console)
    root.addHandler(logfile)


def _check_picklable_envs() -> None:
    """register_env factories travel to the worker processes, so they must be picklable."""
    for name, make_env in registered_envs().items():
        try:
            pickle.dumps(make_env)
        except Exception:
            raise ConfigError(f"--env {name}: its register_env factory cannot be sent to worker processes; "
                              f"register a module-level function or class, not a lambda or closure") from None


def _stop_reason(cfg: Config, stats: RunStats, start_time: float):
    if stats.env_steps >= cfg.run.train_for_env_steps:
        return f"env-step budget reached ({stats.env_steps:,} >= {cfg.run.train_for_env_steps:,})"
    if time.monotonic() - start_time >= cfg.run.train_for_seconds:
        return f"time budget reached ({cfg.run.train_for_seconds:g} s)"
    target = cfg.run.stop_at_return
    if target is not None and len(stats.returns) == stats.returns.maxlen and stats.return_mean >= target:
        return f"mean return of the last 100 episodes {stats.return_mean:.1f} >= {target:g}"
    return None


class Runner:
    def __init__(self, cfg: Config, ctx=None):
        """`ctx`: the started forkserver context (see start_forkserver); started here when not given."""
        cfg.validate()
        self.cfg, self.start_time = cfg, time.monotonic()
        self.ctx = ctx if ctx is not None else start_forkserver(cfg)
        self.lock = _lock_experiment(cfg.experiment_dir, cfg.run.experiment)
        leftovers = _kill_leftovers(cfg.experiment_dir)
        self.exp_dir = _prepare_experiment_dir(cfg)
        self.log_path = os.path.join(self.exp_dir, "train.log")
        _setup_logging(self.log_path)
        for line in leftovers:
            logging.info(line)
        remove_temporary_files(checkpoint_dir(self.exp_dir))
        self.spec = probe_env_spec(cfg.env.env, cfg.env.env_backend)
        for line in resolve_auto(cfg, self.spec, ENVS_PER_WORKER_HINT[self.spec.family]):
            logging.info("auto sizing: %s", line)
        cfg.validate()
        if cfg.learner.learner_threads > usable_cores():
            logging.warning("--learner_threads %d exceeds the %d usable cores: threads will contend; "
                            "use --learner_threads %d", cfg.learner.learner_threads, usable_cores(), usable_cores())
        self.layout = buffer_layout(cfg, self.spec)
        self.shm_path = shm_path(cfg.run.shm_dir, self.exp_dir)
        _check_resources(cfg, self.layout, self.shm_path)
        resume_from, skipped = latest_valid_checkpoint(checkpoint_dir(self.exp_dir))
        for path, reason in skipped:
            logging.warning("%s: using the checkpoint before it", reason)
        if skipped and resume_from is None:
            raise ConfigError(f"--experiment {cfg.run.experiment}: no usable checkpoint ({skipped[-1][1]}); "
                              f"pass --restart to start over")
        self.resume_from = resume_from
        self.env_steps_base = env_steps_of(resume_from)
        if resume_from:
            logging.info("resuming experiment %s from %s (%s env steps; --restart starts over)",
                         cfg.run.experiment, os.path.basename(resume_from), f"{self.env_steps_base:,}")
        if self.ctx is not None:
            _check_picklable_envs()
        cfg.save(os.path.join(self.exp_dir, "config.json"))
        self.buffers = SharedBuffers.create(self.shm_path, self.layout)
        self.lifeline = make_lifeline(self.ctx) if self.ctx is not None else (None, None)
        self.queues = make_queues(cfg.sampler.num_workers, self.ctx, lifeline=self.lifeline[0])
        self.queues.free_slots.put_many(list(range(cfg.num_slots)))
        self.stats = RunStats(cfg, self.exp_dir, self.env_steps_base, self.spec.frameskip, self.buffers.env_steps)
        self.children: dict = {}  # (role, index) -> Child
        self.restart_times: deque = deque()

    def run(self) -> int:
        """Train until a budget is reached; returns the exit code (130 after Ctrl-C)."""
        logging.info("experiment %s: %s on %s, mode %s, %d workers x %d envs, %d slots of %d steps x %d envs",
                     self.cfg.run.experiment, self.cfg.env.env, self.cfg.env.env_backend, self.cfg.run.mode,
                     self.cfg.sampler.num_workers, self.cfg.sampler.num_envs_per_worker, self.cfg.num_slots,
                     self.cfg.sampler.rollout, self.cfg.sampler.envs_per_split)
        idle = self.cfg.sampler.total_splits - self.cfg.slots_per_batch % self.cfg.sampler.total_splits
        if self.cfg.run.mode == "sync" and idle < self.cfg.sampler.total_splits:
            logging.info("sync mode: %d of %d env groups wait each round for a slot; a training batch of a "
                         "multiple of %d slots keeps them all busy", idle, self.cfg.sampler.total_splits,
                         self.cfg.sampler.total_splits)
        exit_code, reason = 0, None
        previous_sigterm = signal.signal(signal.SIGTERM, _raise_terminated)
        try:
            reason = self._run_serial() if self.ctx is None else self._run_processes()
        except KeyboardInterrupt:
            exit_code, reason = 130, "interrupted (Ctrl-C)"
        except Terminated:
            reason = "terminated (SIGTERM)"
        except ChildFailed as exc:
            exit_code, reason = 1, str(exc)
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the stop below runs to its end
            self.stats.stop()
            self._shutdown()
            signal.signal(signal.SIGTERM, previous_sigterm)
        summary = self.stats.close()
        self.lock.close()
        logging.info("stopped: %s", reason)
        brief = {k: v for k, v in summary.items()
                 if k not in ("stage_seconds", "role_wall_seconds", "env_steps_per_sec_windows", "bottleneck_report",
                              "env_step_books")}
        logging.info("summary: %s", json.dumps(brief))
        return exit_code

    # --- serial mode: every role in this process -------------------------------------------------
    def _run_serial(self):
        from sf_engine.learner import Learner
        from sf_engine.policy_worker import PolicyWorker
        from sf_engine.rollout_worker import RolloutWorker
        import torch

        torch.set_num_threads(self.cfg.learner.learner_threads)
        learner = Learner(self.cfg, self.buffers, self.queues, self.spec, checkpoint_dir(self.exp_dir),
                          self.env_steps_base, self.resume_from)
        policy = PolicyWorker(self.cfg, self.buffers, self.queues, self.spec)
        evaluator = None
        if self.cfg.run.eval_every_sec > 0:
            from sf_engine.evaluator import Evaluator

            evaluator = Evaluator(self.cfg, self.buffers, self.queues, self.spec, checkpoint_dir(self.exp_dir))
        workers = [RolloutWorker(self.cfg, w, self.buffers, self.queues, self.spec)
                   for w in range(self.cfg.sampler.num_workers)]
        self._write_processes()
        for worker in workers:
            worker.start()
        try:
            while True:
                for worker in workers:
                    worker.step(0)
                policy.step(0)
                learner.step(0)
                if evaluator is not None:
                    evaluator.step(0)
                reason = self._monitor(timeout_sec=0)
                if reason:
                    return reason
        finally:
            for worker in workers:
                worker.send_stats()
                worker.close()
            if evaluator is not None:
                evaluator.close()
            if not self.cfg.run.sampling_only:
                learner.save()

    # --- async / sync modes: one process per role ---------------------------------------------------
    def _target(self, role: str, index: int, generation: int):
        from sf_engine.learner import run_learner
        from sf_engine.policy_worker import run_policy_worker
        from sf_engine.rollout_worker import run_rollout_worker

        common = (self.shm_path, self.layout, self.queues)
        if role == "learner":
            return run_learner, (self.cfg, *common, self.spec, self.log_path, checkpoint_dir(self.exp_dir),
                                 self.env_steps_base, self.resume_from)
        if role == "policy_worker":
            return run_policy_worker, (self.cfg, *common, self.spec, self.log_path)
        if role == "rollout_worker":
            return run_rollout_worker, (self.cfg, index, *common, self.spec, self.log_path, registered_envs(),
                                        generation)
        from sf_engine.evaluator import run_evaluator

        return run_evaluator, (self.cfg, *common, self.spec, self.log_path, checkpoint_dir(self.exp_dir),
                               registered_envs())

    def _spawn(self, role: str, index: int = 0, generation: int = 0) -> None:
        target, args = self._target(role, index, generation)
        self.buffers.heartbeat[heartbeat_index(role, index)] = 0.0  # not beaten yet
        process = self.ctx.Process(target=target, args=args, name=f"{role}_{index}", daemon=True)
        process.start()
        self.children[(role, index)] = Child(process, time.monotonic(), generation)

    def _run_processes(self):
        roles = [("learner", 0), ("policy_worker", 0)]
        roles += [("rollout_worker", w) for w in range(self.cfg.sampler.num_workers)]
        if self.cfg.run.eval_every_sec > 0:
            roles.append(("evaluator", 0))
        for role, index in roles:
            self._spawn(role, index)
        self._write_processes()
        while True:
            reason = self._monitor(timeout_sec=0.25)
            if reason:
                return reason
            for (role, index), child in list(self.children.items()):
                cause = self._failure(role, index, child)
                if cause:
                    self._recover(role, index, cause)
                    break  # a recovery may replace other children too: look again at the new set

    def _failure(self, role: str, index: int, child: "Child"):
        """Why this child must be replaced (died, or stuck past --stuck_timeout_sec), or None."""
        code = child.process.exitcode
        if code is not None:
            return f"died ({_describe_exit(code)})"
        now, beat = time.monotonic(), float(self.buffers.heartbeat[heartbeat_index(role, index)])
        timeout = self.cfg.run.stuck_timeout_sec
        if beat > 0 and now - beat > timeout:
            return f"stuck (no heartbeat for {now - beat:.0f} s > --stuck_timeout_sec {timeout:g})"
        if beat == 0 and now - child.started > max(timeout, STARTUP_GRACE_SEC):
            return f"stuck while starting ({now - child.started:.0f} s)"
        return None

    def _recover(self, role: str, index: int, cause: str) -> None:
        """Restart a failed rollout or policy worker; a failed learner stops the run."""
        self.stats.consume(drain(self.queues.stats))  # the failed process's traceback, if it sent one
        trace = self.stats.faults.pop((role, index), None)
        where = f"{role.replace('_', ' ')} {index} on env {self.cfg.env.env}"
        logging.error("%s %s%s", where, cause, f":\n{trace.rstrip()}" if trace else "")
        self._kill(role, index)
        if role == "learner":
            last, _ = latest_valid_checkpoint(checkpoint_dir(self.exp_dir))
            raise ChildFailed(f"the learner {cause}; the last good checkpoint is {last or 'none yet'}: run the "
                              f"same command again to resume from it (details in {self.log_path})")
        if role == "evaluator":
            logging.warning("evaluation is off for the rest of this run; training goes on")
            return
        now = time.monotonic()
        self.restart_times.append(now)
        while now - self.restart_times[0] > RESTART_WINDOW_SEC:
            self.restart_times.popleft()
        if len(self.restart_times) > self.cfg.run.max_worker_restarts:
            raise ChildFailed(f"{len(self.restart_times)} worker failures within {RESTART_WINDOW_SEC:.0f} s (last: "
                              f"{where} {cause}); fix the env or raise --max_worker_restarts")
        if role == "rollout_worker":
            generation = self.children[(role, index)].generation + 1
            self._recycle_slots([index])
            self._spawn(role, index, generation)
            self.stats.worker_restarts += 1
            logging.warning("restarted rollout worker %d with fresh envs (%d worker restarts)", index,
                            self.stats.worker_restarts)
        else:  # policy worker: its pending requests are gone, so every rollout worker starts over too
            workers = [key for key in self.children if key[0] == "rollout_worker"]
            for key in workers:
                self._kill(*key)
            self._recycle_slots([w for _, w in workers])
            # the dead policy worker may have broken its queue (see ipc): the new processes get a new one
            self.queues = dataclasses.replace(self.queues, policy_requests=new_policy_requests())
            self.buffers.params_wanted[0] = 1  # the learner sends the shared weights again
            self._spawn(role, index)
            for _, w in workers:
                self._spawn("rollout_worker", w, self.children[("rollout_worker", w)].generation + 1)
            self.stats.policy_worker_restarts += 1
            logging.warning("restarted the policy worker (weights from the shared copy) and the rollout workers")
        self._write_processes()

    def _kill(self, role: str, index: int) -> None:
        process = self.children[(role, index)].process
        if process.is_alive():
            process.kill()
        process.join(timeout=5.0)
        if role == "evaluator":
            del self.children[(role, index)]

    def _recycle_slots(self, workers: list) -> None:
        """Slots the (dead) workers were filling go back to the free pool; their env steps are dropped
        (counted), so no half-filled trajectory is trained on."""
        owner = self.buffers.slot_owner
        slots = np.flatnonzero(np.isin(owner, workers))
        self.stats.steps_dropped_faults += self.buffers.take_rows(slots)
        owner[slots] = -1
        if len(slots):
            self.queues.free_slots.put_many(slots.tolist())

    def _monitor(self, timeout_sec: float):
        """Polls the stats queue: the runner never waits on it (a runner killed while waiting would
        leave it broken for the children that still report to it, see ipc)."""
        if timeout_sec > 0:
            time.sleep(timeout_sec)
        self.stats.consume(drain(self.queues.stats))
        self.stats.tick()
        return _stop_reason(self.cfg, self.stats, self.start_time)

    def _write_processes(self) -> None:
        rows = [("runner", 0, os.getpid())]
        rows += [(role, index, child.process.pid) for (role, index), child in self.children.items()
                 if child.process.is_alive()]
        out = []
        for role, index, pid in rows:
            try:
                created = psutil.Process(pid).create_time()
            except psutil.Error:
                continue
            out.append({"role": role, "index": index, "pid": pid, "create_time": created})
        write_json_atomic(os.path.join(self.exp_dir, "processes.json"), {"processes": out})

    def _shutdown(self) -> None:
        """Stop every child within STOP_TIMEOUT_SEC (the learner saves a checkpoint first), kill what
        does not stop, account the env steps still in flight, release shared memory. A second Ctrl-C
        kills the children at once (checkpoints are written atomically, so none is corrupted)."""
        self.buffers.stop[0] = 1
        try:
            deadline = time.monotonic() + STOP_TIMEOUT_SEC
            for child in self.children.values():
                child.process.join(timeout=max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt:
            logging.info("second Ctrl-C: stopping every process now")
        finally:
            for (role, index), child in self.children.items():
                if child.process.is_alive():
                    logging.warning("%s %d did not stop in time: killed", role, index)
                    child.process.kill()
                    child.process.join(timeout=5.0)
            self.stats.consume(drain(self.queues.stats))
            self.stats.steps_in_flight_at_stop = self.buffers.take_rows(slice(None))
            self.buffers.release()
            if self.children:
                self.children = {}
                self._write_processes()


@dataclass
class Child:
    process: object
    started: float
    generation: int


class Terminated(Exception):
    """SIGTERM reached the runner: stop cleanly as at the end of a budget."""


def _raise_terminated(signum, frame):
    raise Terminated()


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class ChildFailed(RuntimeError):
    """A child process died while the run was going."""


def train(cfg: Config) -> int:
    """Train with a ready Config (the programmatic entry point); returns the exit code."""
    return Runner(cfg).run()


def family_defaults(env_id: str, env_backend: str) -> dict:
    """The defaults of the env's family, then the env's own (envs.partially_observed.ENV_DEFAULTS)."""
    return FAMILY_DEFAULTS[probe_env_spec(env_id, env_backend).family] | ENV_DEFAULTS.get(env_id, {})


def main(argv=None) -> int:
    """Entry point of train.py: flags (with the env family's defaults) -> training. Bad input prints
    one line and returns 2. Envs registered with envs.register_env before this call can be used."""
    try:
        ctx = start_forkserver(parse_config(argv))  # preloading overlaps probing the env
        return Runner(parse_config(argv, family_defaults=family_defaults), ctx).run()
    except (ConfigError, EnvError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
