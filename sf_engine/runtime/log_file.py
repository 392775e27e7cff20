"""The run's log file (train.log), as every process of the run writes it. Runs in the main process and
in every child.
"""

from __future__ import annotations

import logging
import sys


class LogFile(logging.FileHandler):
    """A logging handler that appends to the run's log. When the file cannot be written (a full disk,
    a file system gone read-only) the process stops writing to it and the main process (`report`) says
    so in one line on stderr, once: the run goes on, its main process's lines still reach the terminal,
    where logging's own handler would print a traceback for every line logged from then on, in every
    process. The children are silent about it: the main process logs every few seconds and says it."""

    def __init__(self, path: str, report: bool = True):
        super().__init__(path)
        self.failed, self.report = False, report

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            super().handleError(record)
            return
        self.failed = True
        if self.report:
            reason = error.strerror or error.__class__.__name__
            print(
                f"warning: cannot write the run's log {self.baseFilename} ({reason}): its lines are no longer "
                f"saved there, the run goes on",
                file=sys.stderr,
                flush=True,
            )
        try:
            self.close()
        except OSError:  # the buffered lines cannot be flushed either
            pass
