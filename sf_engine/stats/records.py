"""The main process's records on disk (summary.json, processes.json, config.json, TensorBoard's events), written
so that a full disk or a file system gone read-only costs records, never the run: a file is written whole or
not at all (temporary file, rename), and a write that fails is said once, in one line, and tried again at its
next turn.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import socket
import time

_failing: set = set()  # the records whose last write failed (said once until one succeeds)
_files = itertools.count()  # event files made by this process
RETRY_SEC = 30.0  # TensorBoard's events wait this long after a failed write before the next try


def write_json_atomic(path: str, data: dict) -> None:
    """`data` as JSON in `path`, whole or not at all: an OSError (a full disk) leaves the previous file and
    no temporary one, and is raised."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def keep_record(name: str, write) -> bool:
    """Call `write()`; an OSError is logged once (until a write of `name` succeeds again) and swallowed: the
    run goes on without this record. Returns whether it was written."""
    try:
        write()
    except OSError as exc:
        if name not in _failing:
            _failing.add(name)
            logging.warning(
                "%s not written (%s): the run goes on and tries again at its next turn", name, exc.strerror or exc
            )
        return False
    if name in _failing:
        _failing.discard(name)
        logging.info("%s written again", name)
    return True


class EventLog:
    """TensorBoard's event file of a run directory, written in this thread (TensorBoard's own writer writes
    from a thread that dies with a full disk's error): `add` writes one event and flushes it (see
    keep_record); after a failure the next event starts a new event file."""

    def __init__(self, directory: str):
        self.directory, self.file, self.retry_at = directory, None, 0.0

    def add(self, event) -> None:
        if time.monotonic() >= self.retry_at:  # after a failure, the events of RETRY_SEC are not written
            keep_record("TensorBoard events", lambda: self._write(event.SerializeToString()))

    def _write(self, data: bytes) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.summary.writer.record_writer import RecordWriter

        new = None
        try:
            if self.file is None:
                name = f"events.out.tfevents.{time.time():010.0f}.{socket.gethostname()}.{os.getpid()}.{next(_files)}"
                new = os.path.join(self.directory, name)
                self.file = open(new, "ab")
                RecordWriter(self.file).write(
                    Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString()
                )
            RecordWriter(self.file).write(data)
            self.file.flush()
        except OSError:
            self.close()
            self.retry_at = time.monotonic() + RETRY_SEC
            if new is not None:  # an event file with no event: not left behind
                with contextlib.suppress(OSError):
                    os.unlink(new)
            raise

    def close(self) -> None:
        if self.file is not None:
            with contextlib.suppress(OSError):  # what could not be flushed is lost with the file's last event
                self.file.close()
            self.file = None
