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
import stat
import sys

import psutil

from sf_engine.config.groups import ConfigError
from sf_engine.envs import reap_orphaned_processes
from sf_engine.runtime.checkpoint import list_checkpoints, remove_temporary_files
from sf_engine.runtime.log_file import LogFile
from sf_engine.runtime.shared_buffers import SHM_PREFIX, SIDE_SUFFIXES
from sf_engine.stats.records import keep_record, write_json_atomic

_OWN_FILES = ("config.json", "summary.json", "processes.json", "train.log", "events.out.tfevents.*")


class Experiment:
    def __init__(self, plan):
        self.plan, self.paths = plan, plan.paths
        self._lock_file = None

    def lock(self) -> None:
        """Lock the experiment (one run at a time) and check that the checkpoint the plan chose is still
        the latest; nothing in the experiment changes yet."""
        os.makedirs(self.paths.checkpoint_dir, exist_ok=True)
        self._lock_file = _lock(self.paths.experiment_dir, self.plan.cfg.run.experiment)
        if (
            not self.plan.cfg.run.restart
            and tuple(list_checkpoints(self.paths.checkpoint_dir)) != self.plan.checkpoints_seen
        ):
            self.close()  # another run of the experiment wrote a checkpoint since the plan chose one
            raise ConfigError(
                f"--experiment {self.plan.cfg.run.experiment} changed while this run was starting "
                f"(another run wrote a checkpoint): run the same command again to resume from it"
            )

    def prepare(self) -> None:
        """Once locked: kill what a dead run of the experiment left alive, clear it on --restart, start
        the log, remove half-written checkpoints and write config.json."""
        leftovers = _remove_leftovers(self.paths.experiment_dir, self.plan.cfg.run.shm_dir)
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
        path = os.path.join(self.paths.experiment_dir, "config.json")
        try:
            write_json_atomic(path, {**self.plan.cfg.to_dict(), "command_line": list(self.plan.command_line)})
        except OSError as exc:
            raise ConfigError(
                f"--train_dir {self.plan.cfg.run.train_dir}: cannot write {path} ({exc.strerror or exc}): "
                f"free some space there or choose another --train_dir"
            ) from None

    def write_processes(self, rows: list) -> None:
        """processes.json: (role, index, pid) of every live process of the run with its start time and
        command line, and the run's shared-memory file, so that the next start can recognise and remove
        what is left if this main process dies."""
        out = []
        for role, index, pid in [("runner", 0, os.getpid())] + rows:
            try:
                process = psutil.Process(pid)
                out.append(
                    {
                        "role": role,
                        "index": index,
                        "pid": pid,
                        "started_sec": started_sec(process),
                        "cmdline": process.cmdline(),
                    }
                )
            except psutil.Error:
                continue
        data = {
            "processes": out,
            "shm_path": os.path.realpath(self.paths.shm_path),
            "experiment": _identity(self.paths.experiment_dir),
        }
        keep_record(
            "processes.json", lambda: write_json_atomic(os.path.join(self.paths.experiment_dir, "processes.json"), data)
        )

    def close(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None


def check_not_running(train_dir: str, experiment: str) -> None:
    """ConfigError at once if another process runs `experiment` (it holds the lock): asked before the env is
    probed or anything sized, so that a second copy is refused in a moment. Changes nothing on disk."""
    path = os.path.join(train_dir, experiment, ".lock")
    if os.path.exists(path):
        _lock(os.path.dirname(path), experiment, mode="r").close()


def _lock(experiment_dir: str, experiment: str, mode: str = "a+"):
    """One run per experiment at a time (they would share checkpoints and the shared-memory file)."""
    lock = open(os.path.join(experiment_dir, ".lock"), mode)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ConfigError(
            f"--experiment {experiment} is already running in another process: "
            f"wait for it or choose another --experiment"
        ) from None
    return lock


def _identity(experiment_dir: str) -> list:
    """What ties a processes.json to this very directory: its real path, device and inode (a copied or
    moved experiment folder, or one received from elsewhere, does not match)."""
    info = os.stat(experiment_dir)
    return [os.path.realpath(experiment_dir), info.st_dev, info.st_ino]


def read_processes(experiment_dir: str) -> dict:
    """The experiment's processes.json, if this user wrote it for this very directory (owned by this
    user, writable by nobody else, the directory's identity recorded in it); {} otherwise."""
    path = os.path.join(experiment_dir, "processes.json")
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
            return {}
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) and data.get("experiment") == _identity(experiment_dir) else {}
    except (OSError, ValueError):
        return {}


def leftover_segment(experiment_dir: str, shm_dir: str, processes: dict | None = None):
    """The shared-memory file a killed run of the experiment left, if it is still there and can only
    be that: a regular file (not a link) of this user, named as shm_path names them, directly in
    `shm_dir`. None otherwise. `processes`: the experiment's processes.json when already read."""
    path = (read_processes(experiment_dir) if processes is None else processes).get("shm_path")
    if not isinstance(path, str) or os.path.dirname(path) != os.path.realpath(shm_dir):
        return None
    if not os.path.basename(path).startswith(SHM_PREFIX):
        return None
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return path if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() else None


def _remove_leftovers(experiment_dir: str, shm_dir: str) -> list:
    """What a killed run of this experiment left: its processes still alive (recognised by pid, start
    time and command line, all three) are killed, its shared-memory file removed. Returns what was done."""
    done, processes = [], read_processes(experiment_dir)
    rows = processes.get("processes", [])
    rows = [row for row in rows if isinstance(row, dict)] if isinstance(rows, list) else []
    if any(row.get("role") == "runner" and _alive(row) for row in rows):
        return done  # its main process lives (and holds another lock): a live run, not leftovers
    for row in rows:
        if row.get("pid") != os.getpid() and _alive(row):
            try:
                psutil.Process(row["pid"]).kill()
                done.append(f"killed {row.get('role')} {row.get('index')} (pid {row['pid']}) left by a previous run")
            except psutil.Error:
                pass
    done += reap_orphaned_processes()  # env processes (VizDoom's games) that killed workers left alive
    segment = leftover_segment(experiment_dir, shm_dir, processes)
    if segment is not None:
        for path in [segment] + [segment + suffix for suffix in SIDE_SUFFIXES]:  # and the files beside it
            try:
                os.unlink(path)
                done.append(f"removed {path} left by a previous run")
            except OSError:
                pass
    return done


def started_sec(process) -> float:
    """Seconds from the machine's boot to the start of `process` (a psutil.Process): its start in clock ticks as
    the kernel keeps it (/proc/PID/stat), exact and unmoved by setting the clock (psutil's create_time adds the
    kernel's boot time, which follows the clock in whole seconds, so two reads of it could differ).
    psutil.NoSuchProcess where the process is gone."""
    try:
        with open(f"/proc/{process.pid}/stat", "rb") as f:
            after_name = f.read().rsplit(b")", 1)[1].split()  # the fields after the command's name, the 3rd on
        return int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # the 22nd: starttime
    except (OSError, IndexError, ValueError):
        raise psutil.NoSuchProcess(process.pid) from None


def _alive(row: dict) -> bool:
    """Whether the process of a processes.json row still runs: pid, start time and command line match."""
    try:
        process = psutil.Process(row["pid"])
        return abs(started_sec(process) - row["started_sec"]) < 1e-3 and process.cmdline() == row.get("cmdline")
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def _setup_logging(log_path: str) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.INFO)
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(logging.Formatter("%(message)s"))
    logfile = LogFile(log_path)  # a log that cannot be written (a full disk) is one line, and the run goes on
    logfile.setFormatter(logging.Formatter("%(asctime)s runner %(levelname)s %(message)s"))
    root.addHandler(console)
    root.addHandler(logfile)
