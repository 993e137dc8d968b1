"""Training progress on the terminal (rank 0 only: the trainer passes ``enabled=rank == 0``).

The per-step metrics file is :mod:`vlmcp.report.metrics`.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["ProgressBar", "format_duration"]

def format_duration(seconds: float) -> str:
    """``H:MM:SS``, or ``?`` when unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class ProgressBar:
    """A dependency-free progress bar: step/total, loss, tokens/s and ETA.

    On a terminal it redraws one line in place; otherwise (a log file, a CI pipe) it
    prints a plain line every ``log_every`` steps and at the last step, so logs stay
    readable and short.

    Args:
        total: the run's total number of steps.
        initial: steps already done (a resumed run); rates and ETA count only the steps
            of this process.
        stream: where to write (default ``sys.stdout``).
        enabled: False makes every call a no-op (ranks other than 0).
        width: characters of the bar on a terminal.
        log_every: steps between plain lines; default about 20 lines per run.
        clock: time source in seconds (tests pass a fake one).
    """

    def __init__(self, total: int, *, initial: int = 0, stream: TextIO | None = None,
                 enabled: bool = True, width: int = 24, log_every: int | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if isinstance(total, bool) or not isinstance(total, int) or total < 1:
            raise ValueError(f"total must be an int >= 1, got {total!r}")
        if not 0 <= initial <= total:
            raise ValueError(f"initial must be in [0, total={total}], got {initial!r}")
        self.total, self.initial, self.enabled, self.width = total, initial, enabled, width
        self.stream = stream if stream is not None else sys.stdout
        self.log_every = log_every or max(1, total // 20)
        self.clock = clock
        self.tty = enabled and bool(getattr(self.stream, "isatty", lambda: False)())
        self._start = clock()
        self._tokens = 0
        self._drawn = 0  # characters of the line currently on a terminal

    def line(self, step: int, loss: float | None, extra: str = "") -> str:
        """The status text for ``step`` (without the bar); ``extra`` follows the loss."""
        elapsed = self.clock() - self._start
        done = step - self.initial
        rate = self._tokens / elapsed if elapsed > 0 else float("nan")
        eta = (self.total - step) * elapsed / done if done > 0 else float("nan")
        loss_text = f"{loss:.4f}" if loss is not None else "-"
        rate_text = f"{rate:,.0f}" if math.isfinite(rate) else "-"
        extra = f"{extra}  " if extra else ""
        return (f"step {step}/{self.total}  loss {loss_text}  {extra}{rate_text} tok/s  "
                f"elapsed {format_duration(elapsed)}  ETA {format_duration(eta)}")

    def update(self, step: int, *, loss: float | None = None, tokens: int = 0, extra: str = "") -> None:
        """Report that ``step`` steps are complete.

        Args:
            step: steps completed so far (absolute, not this process's count).
            loss: this step's loss.
            tokens: tokens this step processed (added to the tokens/s count).
            extra: more of the step's figures, shown after the loss (``lr 1e-05  grad 0.52``).
        """
        if not self.enabled:
            return
        self._tokens += tokens
        text = self.line(step, loss, extra)
        if self.tty:
            filled = self.width * step // self.total
            text = f"[{'#' * filled}{'.' * (self.width - filled)}] {text}"
            self.stream.write("\r" + text + " " * max(0, self._drawn - len(text)))
            self._drawn = len(text)
        elif (step - self.initial) % self.log_every == 0 or step == self.total:
            self.stream.write(text + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        """Print a line of its own (an evaluation's result) without breaking the bar's line."""
        if not self.enabled:
            return
        self.stream.write(("\n" if self.tty and self._drawn else "") + text + "\n")
        self.stream.flush()
        self._drawn = 0

    def close(self) -> None:
        """End the terminal line (call once, after the last update)."""
        if self.enabled and self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = 0

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
