"""The experiment directory of a run (<train_dir>/<experiment>/): the lock that keeps one run per
experiment, what a dead run left behind, --restart, config.json, the log file and processes.json.
Runs in the main process, after the run plan was built (so a bad flag never gets here).
"""
from __future__ import annotations

import fcntl
import glob
import json
import logging
import os
import shutil
import sys

import psutil

from sf_engine.checkpoint import latest_valid_checkpoint, remove_temporary_files
from sf_engine.config import ConfigError
from sf_engine.report import write_json_atomic

_OWN_FILES = ("config.json", "summary.json", "processes.json", "train.log", "events.out.tfevents.*")


class Experiment:
    def __init__(self, plan):
        self.plan, self.paths = plan, plan.paths
        self.lock = None

    def open(self) -> None:
        """Lock the experiment, kill what a dead run of it left alive, clear it on --restart, start the
        log, remove half-written checkpoints and write config.json."""
        os.makedirs(self.paths.checkpoint_dir, exist_ok=True)
        self.lock = _lock(self.paths.experiment_dir, self.plan.cfg.run.experiment)
        leftovers = _kill_leftovers(os.path.join(self.paths.experiment_dir, "processes.json"))
        if not self.plan.cfg.run.restart and latest_valid_checkpoint(self.paths.checkpoint_dir)[0] != self.plan.resume_from:
            self.close()  # another run of the experiment wrote a checkpoint since the plan chose one
            raise ConfigError(f"--experiment {self.plan.cfg.run.experiment} changed while this run was starting "
                              f"(another run wrote a checkpoint): run the same command again to resume from it")
        if self.plan.cfg.run.restart:
            shutil.rmtree(self.paths.checkpoint_dir, ignore_errors=True)
            os.makedirs(self.paths.checkpoint_dir, exist_ok=True)
            for pattern in _OWN_FILES:
                for path in glob.glob(os.path.join(self.paths.experiment_dir, pattern)):
                    os.unlink(path)
        _setup_logging(self.paths.log_path)
        for line in leftovers:
            logging.info(line)
        remove_temporary_files(self.paths.checkpoint_dir)
        # the resolved config (no 'auto') and the command line that was given
        write_json_atomic(os.path.join(self.paths.experiment_dir, "config.json"),
                          {**self.plan.cfg.to_dict(), "command_line": list(self.plan.command_line)})

    def write_processes(self, rows: list) -> None:
        """processes.json: (role, index, pid) of every live process of the run, with its start time, so
        that the next start can recognise and kill them if this main process dies."""
        out = []
        for role, index, pid in [("runner", 0, os.getpid())] + rows:
            try:
                created = psutil.Process(pid).create_time()
            except psutil.Error:
                continue
            out.append({"role": role, "index": index, "pid": pid, "create_time": created})
        write_json_atomic(os.path.join(self.paths.experiment_dir, "processes.json"), {"processes": out})

    def close(self) -> None:
        if self.lock is not None:
            self.lock.close()
            self.lock = None


def _lock(experiment_dir: str, experiment: str):
    """One run per experiment at a time (they would share checkpoints and the shared-memory file)."""
    lock = open(os.path.join(experiment_dir, ".lock"), "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ConfigError(f"--experiment {experiment} is already running in another process: "
                          f"wait for it or choose another --experiment") from None
    return lock


def _kill_leftovers(path: str) -> list:
    """Processes of a dead run of this experiment (its main process was killed) that are still alive:
    recognised by pid and start time in its processes.json, and killed. Returns what was done."""
    done = []
    try:
        with open(path) as f:
            rows = json.load(f)["processes"]
    except (OSError, ValueError, KeyError, TypeError):
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
