"""Training progress on the terminal, and per-step metrics as JSON lines.

Both are used on rank 0 only (the trainer passes ``enabled=rank == 0`` to the bar and
opens the writer on rank 0); neither communicates.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

__all__ = ["METRIC_FIELDS", "MetricsWriter", "ProgressBar", "format_duration", "read_metrics"]

METRIC_FIELDS = ("step", "loss", "grad_norm_vision", "grad_norm_projector", "grad_norm_llm",
                 "tokens", "seconds")
"""Keys every metrics record has. ``step`` counts optimizer steps completed (1 after
the first step), the same count a checkpoint is saved under."""


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

    def line(self, step: int, loss: float | None) -> str:
        """The status text for ``step`` (without the bar)."""
        elapsed = self.clock() - self._start
        done = step - self.initial
        rate = self._tokens / elapsed if elapsed > 0 else float("nan")
        eta = (self.total - step) * elapsed / done if done > 0 else float("nan")
        loss_text = f"{loss:.4f}" if loss is not None else "-"
        rate_text = f"{rate:,.0f}" if math.isfinite(rate) else "-"
        return (f"step {step}/{self.total}  loss {loss_text}  {rate_text} tok/s  "
                f"elapsed {format_duration(elapsed)}  ETA {format_duration(eta)}")

    def update(self, step: int, *, loss: float | None = None, tokens: int = 0) -> None:
        """Report that ``step`` steps are complete.

        Args:
            step: steps completed so far (absolute, not this process's count).
            loss: this step's loss.
            tokens: tokens this step processed (added to the tokens/s count).
        """
        if not self.enabled:
            return
        self._tokens += tokens
        text = self.line(step, loss)
        if self.tty:
            filled = self.width * step // self.total
            text = f"[{'#' * filled}{'.' * (self.width - filled)}] {text}"
            self.stream.write("\r" + text + " " * max(0, self._drawn - len(text)))
            self._drawn = len(text)
        elif (step - self.initial) % self.log_every == 0 or step == self.total:
            self.stream.write(text + "\n")
        self.stream.flush()

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


def _json_value(value: Any) -> Any:
    # NaN/inf are not JSON; a diverged step is recorded as null rather than a file
    # that strict readers reject.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # 0-d tensors, numpy scalars
        return _json_value(value.item())
    return value


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Records of a metrics JSONL file, in file order.

    A last line without its newline that does not parse (the writer was killed
    mid-line) is ignored; a malformed line elsewhere raises ``ValueError`` naming it.
    """
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            if number == len(lines):  # no newline after it: a torn final write
                break
            raise ValueError(f"{path}:{number}: not a JSON object: {err}") from None
    return records


class MetricsWriter:
    """Append one JSON object per step to a JSONL file.

    Args:
        path: the JSONL file (its directory is created).
        resume_step: None for a fresh run (an existing file is replaced). For a run
            resumed from the checkpoint of step N, pass N: records with ``step <= N``
            are kept and later ones (written after that checkpoint, before the crash,
            and about to be recomputed) are dropped, so the file never holds a step
            twice.
    """

    def __init__(self, path: str | os.PathLike, *, resume_step: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept: list[dict[str, Any]] = []
        if resume_step is not None and self.path.exists():
            kept = [r for r in read_metrics(self.path) if int(r["step"]) <= resume_step]
        # Rewrite through a temporary file: a crash here must not lose the kept records.
        temp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        with open(temp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, allow_nan=False) + "\n" for r in kept)
        os.replace(temp, self.path)
        self.last_step: int | None = int(kept[-1]["step"]) if kept else None
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one step's record (it must have every key of :data:`METRIC_FIELDS`).

        Raises:
            ValueError: for a missing key, or a step not after the last written one.
        """
        missing = [k for k in METRIC_FIELDS if k not in record]
        if missing:
            raise ValueError(f"metrics record lacks {missing}; every record needs {list(METRIC_FIELDS)}")
        step = int(record["step"])
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(f"metrics step {step} is not after the last written step {self.last_step}")
        line = json.dumps({k: _json_value(v) for k, v in record.items()}, allow_nan=False)
        self._file.write(line + "\n")
        self._file.flush()  # a killed run keeps every finished step
        self.last_step = step

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
