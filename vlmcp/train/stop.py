"""How a training rank takes SIGTERM and Ctrl-C (SIGINT), in both trainers.

SIGTERM (a preemption, the launcher forwarding its own) and a first SIGINT (Ctrl-C: the terminal
sends it to every process of the job) only set a flag; the loop reads it into the step's
all-reduce, so every rank finishes the same step, saves a checkpoint and stops. A second SIGINT
exits the rank at once with status 130, as a second Ctrl-C should; the launcher kills the
others (:func:`vlmcp.ranks.run_command` with ``interrupt=True``).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

__all__ = ["StopSignals", "stop_signals"]


class StopSignals:
    """The flags the signal handlers set.

    Attributes:
        flag: a SIGTERM or SIGINT came: stop after this step, with a checkpoint.
        interrupted: it was a SIGINT (the run then exits 130).
    """

    def __init__(self) -> None:
        self.flag = False
        self.interrupted = False

    def __call__(self, signum, _frame) -> None:
        if signum == signal.SIGINT:
            if self.interrupted:
                os._exit(130)
            self.interrupted = True
        self.flag = True


@contextlib.contextmanager
def stop_signals() -> Iterator[StopSignals]:
    """SIGTERM and SIGINT handled by a fresh :class:`StopSignals` for the block (restored after)."""
    stop = StopSignals()
    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
