"""The main process of a training run: the command line becomes a run plan (sf_engine.run.plan), the
experiment directory is opened (sf_engine.run.experiment), the shared buffers and queues are made, and the
roles run (sf_engine.run.supervisor for async and sync, sf_engine.run.serial in one process) until a budget or a
stop; the stats are aggregated (sf_engine.stats.run_stats) and written (sf_engine.stats.report) meanwhile.

In async and sync modes every role is a child process started through a forkserver that preloads
torch and the env libraries once, while the main process builds the plan (start-up is part of the
user's wait).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
import time
from dataclasses import dataclass

from sf_engine.config.algorithms import built_in_algorithms
from sf_engine.config.checks import check_flags
from sf_engine.config.cli import command_line_of, make_config, parse_flags
from sf_engine.config.groups import ConfigError
from sf_engine.config.parallel import node_groups
from sf_engine.envs import EnvError
from sf_engine.envs.registry import may_use_envpool
from sf_engine.run.experiment import Experiment, check_not_running
from sf_engine.run.plan import build_plan, log_plan, saved_config
from sf_engine.run.supervisor import ChildFailed, Supervisor
from sf_engine.runtime.checkpoint import checkpoint_dir, env_steps_of, latest_valid_checkpoint
from sf_engine.runtime.device_slots import make_device_obs
from sf_engine.runtime.ipc import drain_into, make_lifeline
from sf_engine.runtime.role import RunStopped
from sf_engine.runtime.run_plan import RunPlan
from sf_engine.runtime.shared_buffers import GROUP_BUDGET, GROUP_RUNNING, OTHER_GROUP_STOPPED, SharedBuffers
from sf_engine.runtime.slot_pool import SlotPool, env_step_stop
from sf_engine.runtime.wiring import run_queues
from sf_engine.stats.report import Reporter
from sf_engine.stats.run_stats import RunStats
from sf_engine.stats.stages import LearnerStage, LiveStage
from sf_engine.stats.tracking import WandbRun

MONITOR_EVERY_SEC = 0.25
MONITOR_NEAR_BUDGET_SEC = 0.01  # the shortest wait between two looks, where the env-step budget is near


def start_forkserver(env: str, env_backend: str):
    """Start the forkserver now so its preloading (torch, envpool) overlaps building the plan."""
    mp_context = multiprocessing.get_context("forkserver")
    modules = ["envpool"] if may_use_envpool(env, env_backend) else []
    mp_context.set_forkserver_preload(
        modules
        + [
            "gymnasium",
            "torch",
            "sf_engine.roles.rollout_worker",
            "sf_engine.roles.policy_worker",
            "sf_engine.roles.device_sampler",
            "sf_engine.roles.learner",
            "sf_engine.roles.evaluator",
        ]
        + [spec.learner.partition(":")[0] for spec in built_in_algorithms().values()]  # the learner's, built by name
    )
    multiprocessing.forkserver.ensure_running()
    return mp_context


class Terminated(Exception):
    """SIGTERM reached the main process: stop cleanly as at the end of a budget."""


def _raise_terminated(signum, frame):
    raise Terminated()


def env_step_budget_reached(budget: int) -> str:
    return f"env-step budget reached ({budget:,} env steps; --train_for_env_steps raises it)"


def _until_next_look(stop_at: int | None, env_steps: int, last_look: tuple) -> float:
    """Seconds the runner waits before it looks at the run again: MONITOR_EVERY_SEC, or less where the env-step
    budget `stop_at` comes sooner at the rate since the last look ((time, env steps)), so that a fast run passes its
    budget by a few hundredths of a second's sampling, not by a quarter second's."""
    since = time.monotonic() - last_look[0]
    rate = (env_steps - last_look[1]) / since if since > 0 else 0.0
    if stop_at is None or rate <= 0:
        return MONITOR_EVERY_SEC
    return min(MONITOR_EVERY_SEC, max(MONITOR_NEAR_BUDGET_SEC, (stop_at - env_steps) / rate))


def _budget_reached(cfg, stats: RunStats, start_time: float, groups_stop: int = GROUP_RUNNING) -> str | None:
    """Why the run stops on a budget that applies (with node groups, their learners' stop: `groups_stop`), or None.
    A stop on the run's figures is _target_reached's."""
    steps, seconds = cfg.run.train_for_env_steps, cfg.run.train_for_seconds
    if groups_stop == GROUP_BUDGET:
        return (
            f"env-step budget of the node groups reached ({steps:,} env steps of all of them; --train_for_env_steps "
            f"raises it)"
        )
    if groups_stop == OTHER_GROUP_STOPPED:
        return "another node group stopped (--dist_init): the learner ranks of all of them stopped together"
    if steps is not None and stats.env_steps >= env_step_stop(cfg, stats.env_steps_base):
        return env_step_budget_reached(steps)
    if seconds is not None and time.monotonic() - start_time >= seconds:
        return f"time budget reached ({seconds:g} s; --train_for_seconds raises it)"
    return None


def _target_reached(cfg, stats: RunStats) -> str | None:
    """Why the run stops on its figures (--stop_at_return, --stop_at_eval_return), or None."""
    target = cfg.run.stop_at_return
    if target is not None and len(stats.returns) == stats.returns.maxlen and stats.return_mean >= target:
        return f"mean return of the last 100 episodes {stats.return_mean:.1f} >= {target:g}"
    target, evaluation = cfg.run.stop_at_eval_return, stats.evaluation
    if target is not None and evaluation is not None and evaluation.return_mean >= target:
        return f"greedy evaluation of version {evaluation.version}: return {evaluation.return_mean:.1f} >= {target:g}"
    return None


@dataclass(frozen=True)
class Outcome:
    """How a run ended: its exit code (0, 130 after Ctrl-C, 1 after a failure), why it stopped, its last
    summary, and the exception of a user's observer that stopped it (None otherwise)."""

    exit_code: int
    reason: str
    summary: dict
    observer_error: BaseException | None = None


def run(plan: RunPlan, mp_context=None, exits_after: bool = False) -> int:
    """Run the plan until a budget is reached; returns the exit code (run_plan)."""
    return run_plan(plan, mp_context, exits_after).exit_code


def run_plan(plan: RunPlan, mp_context=None, exits_after: bool = False, observers=()) -> Outcome:
    """Run the plan until a budget is reached (or an observer asks to stop); returns the Outcome (exit code 130
    after Ctrl-C, 1 after a failure the run cannot go on from). `mp_context`: the started forkserver (async and
    sync modes; started here when not given). `observers`: the user's (sf_engine.stats.observers). Whatever
    happens, the shared memory is released, the last summary written and the experiment unlocked."""
    cfg, serial = plan.cfg, plan.cfg.run.mode == "serial"
    if not serial and mp_context is None:
        mp_context = start_forkserver(cfg.env.env, cfg.env.env_backend)
    rendezvous = _serve_rendezvous(cfg)  # node group 0 (--dist_init): while this run lives; refused before any write
    experiment = Experiment(plan)
    experiment.lock()
    tracker, summary, exit_code, reporter = None, None, 1, None
    # once the stop begins, Ctrl-C cannot cut it short (_train); `exits_after` (train.py): nor the exit that follows
    previous_sigint = signal.SIG_IGN if exits_after else signal.getsignal(signal.SIGINT)
    try:
        tracker = WandbRun.start(plan)  # before anything in the experiment changes: W&B may refuse
        experiment.prepare()
        log_plan(plan)
        experiment.write_processes([])  # the shared-memory file's name first, for the next start if this one dies
        buffers = SharedBuffers.create(plan.paths.shm_path, plan.layout)
        try:
            # the write end stays open in this process while it lives: children see EOF once it is gone
            lifeline = (None, None) if serial else make_lifeline(mp_context)
            queues = run_queues(cfg, None if serial else mp_context, lifeline[0])
            queues.device_obs = make_device_obs(plan)
            SlotPool(buffers, queues).fill()
            stats = RunStats(
                plan.env_steps_base,
                buffers.env_steps,
                on_gpu=cfg.run.device.startswith("cuda"),
                ordered_workers=cfg.sampler.num_workers if cfg.run.deterministic else 0,
                learner_live=LiveStage("learner", LearnerStage, buffers.learner_stage),
            )
            reporter = Reporter(
                stats,
                cfg,
                plan.spec.frameskip,
                plan.paths.experiment_dir,
                tracker,
                resumed=bool(plan.resume_from),
                observers=observers,
            )
            try:
                exit_code, reason = _train(plan, experiment, mp_context, buffers, queues, stats, reporter)
            finally:
                summary = reporter.close()
        finally:
            buffers.release()
    finally:
        del rendezvous  # the node groups' rendezvous (node group 0) ends with the run
        if tracker is not None:
            tracker.finish(summary, exit_code)
        experiment.close()
        signal.signal(signal.SIGINT, previous_sigint)
    logging.info("stopped: %s", reason)
    brief = {k: v for k, v in summary.items() if k not in _NOT_IN_THE_LAST_LINE}
    logging.info("summary: %s", json.dumps(brief))
    return Outcome(exit_code, reason, summary, reporter.observers.error)


def _serve_rendezvous(cfg):
    """Node group 0's rendezvous of the learner ranks of every node group (--dist_init), served by this process; None
    elsewhere. ConfigError of one line where it cannot be served."""
    groups = node_groups(cfg.parallel, os.environ)
    if groups is None or not groups.serves:
        return None
    from sf_engine.runtime.rendezvous import serve

    try:
        return serve(groups, cfg.parallel.collective_timeout_sec)
    except RuntimeError as exc:
        raise ConfigError(
            f"--dist_init: the rendezvous cannot be served at {groups.host}:{groups.port} "
            f"({str(exc).splitlines()[0]}): give a free port of this machine"
        ) from None


_NOT_IN_THE_LAST_LINE = (
    "stage_seconds",
    "role_wall_seconds",
    "env_steps_per_sec_windows",
    "bottleneck_report",
    "env_step_books",
)


def _train(plan: RunPlan, experiment, mp_context, buffers, queues, stats: RunStats, reporter: Reporter):
    """The roles run until a stop; returns (exit code, the reason of the stop). Every role has stopped
    (and the env steps in flight are counted) when it returns or raises."""
    cfg, start_time = plan.cfg, time.monotonic()
    exit_code, reason, roles, on_figures = 0, None, None, False
    previous_sigterm = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        if cfg.run.mode == "serial":
            from sf_engine.run.serial import SerialRoles

            roles = SerialRoles(plan, buffers, queues)
        else:
            roles = Supervisor(plan, experiment, mp_context, buffers, queues, stats)
        roles.start()
        stop_at, last_look = env_step_stop(cfg, stats.env_steps_base), (time.monotonic(), stats.env_steps)
        while reason is None:
            if cfg.run.mode != "serial":
                wait = _until_next_look(stop_at, stats.env_steps, last_look)
                last_look = (time.monotonic(), stats.env_steps)  # the next rate: over this wait and this look
                time.sleep(wait)
            roles.step()
            drain_into(queues.stats, stats.consume)  # polled: the main process never waits on it (see ipc)
            reporter.tick()
            reason = _budget_reached(cfg, stats, start_time, int(buffers.node_groups[0]))
            if reason is None:
                reason = _target_reached(cfg, stats) or reporter.stop_reason
                on_figures = reason is not None
            if reporter.observers.error is not None:
                exit_code = 1
    except KeyboardInterrupt:
        exit_code, reason = 130, "interrupted (Ctrl-C)"
    except Terminated:
        reason = "terminated (SIGTERM)"
    except (ChildFailed, RunStopped) as exc:  # RunStopped: a role stopped a serial run (in one process)
        exit_code, reason = 1, str(exc)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the stop below runs to its end: a second Ctrl-C only
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # hurries the children's (Supervisor.shutdown)
        stats.stop(episodes_final=on_figures)
        try:
            if roles is not None:
                roles.shutdown()
        finally:
            drain_into(queues.stats, stats.consume)
            stats.books.in_flight_at_stop = buffers.take_rows(slice(None))
            if buffers.remote_books is not None:  # sampler nodes: what they stepped and never placed here
                from sf_engine.scaleout.receiver import remote_books_at_stop

                stats.books.dropped_lost_samplers, remote_in_flight = remote_books_at_stop(buffers.remote_books)
                stats.books.in_flight_at_stop += remote_in_flight
            signal.signal(signal.SIGTERM, previous_sigterm)
    return exit_code, reason


def already_done(cfg) -> str | None:
    """The one line of a re-run with nothing to train: the experiment's newest valid checkpoint already
    holds its env-step budget (a time budget is per run, so only that budget can be spent before a run
    starts); None otherwise. Read before the env is probed or anything measured. None where the plan has
    something to report: flags that do not pass their checks, an experiment of another env or with an
    unreadable config.json."""
    budget, experiment_dir = cfg.run.train_for_env_steps, os.path.join(cfg.run.train_dir, cfg.run.experiment)
    if budget is None or cfg.run.restart or not _same_env(cfg, os.path.join(experiment_dir, "config.json")):
        return None
    try:
        check_flags(cfg)
    except ConfigError:
        return None
    path, _ = latest_valid_checkpoint(checkpoint_dir(experiment_dir))
    if path is None or env_steps_of(path) < budget:
        return None
    return (
        f"experiment {cfg.run.experiment} has nothing to train: {env_step_budget_reached(budget)} by its "
        f"checkpoint of {env_steps_of(path):,} env steps"
    )


def _same_env(cfg, config_path: str) -> bool:
    """Whether the experiment's config.json (if it has one) is readable and of the env of `cfg`."""
    if not os.path.exists(config_path):
        return True
    try:
        with open(config_path) as f:
            return json.load(f)["env"]["env"] == cfg.env.env
    except (OSError, ValueError, KeyError, TypeError):
        return False


def launch(given: dict, observers=(), exits_after: bool = False, before_processes=lambda cfg: None, argv=None):
    """A run of the flags `given` (parse_flags's of the command line `argv`, or given_of_values' of a call's keywords,
    then recorded as command_line_of's): flags -> run plan -> training. Returns the one line of a re-run with nothing
    to train (already_done), or (the run's Outcome, its experiment directory). Bad input raises ConfigError or
    EnvError, before anything on disk changes. `before_processes(cfg)`: called with the flags' config before
    any process starts. Envs registered with sf_engine.envs.register_env before this call can be used."""
    saved = saved_config(given)
    first = make_config(given, saved=saved)  # the env and mode given, to start the forkserver's preloading early
    check_not_running(first.run.train_dir, first.run.experiment)
    done = already_done(first)
    if done:
        return done
    before_processes(first)
    mp_context = start_forkserver(first.env.env, first.env.env_backend) if first.run.mode != "serial" else None
    plan = build_plan(command_line_of(given) if argv is None else argv, given, saved)
    return run_plan(plan, mp_context, exits_after, observers), plan.paths.experiment_dir


def main(argv=None) -> int:
    """Entry point of train.py: bad input prints one line and returns 2."""
    try:
        argv = sys.argv[1:] if argv is None else argv
        launched = launch(parse_flags(argv), exits_after=True, argv=argv)
    except (ConfigError, EnvError) as exc:  # bad input, found while building the plan or locking the experiment
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if isinstance(launched, str):
        print(launched)
        return 0
    return launched[0].exit_code


if __name__ == "__main__":  # python -m sf_engine.run.runner: train.py (the seed runner starts runs so)
    sys.exit(main())
