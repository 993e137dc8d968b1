"""Per-step training metrics as JSON lines: the trainers write them, the loss curve reads them.

Written on rank 0 only; nothing here communicates. A resumed run keeps the records up to its
checkpoint and drops the later ones, so the file never holds a step twice.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["EVAL_FIELDS", "METRIC_FIELDS", "MetricsWriter", "read_metrics"]

METRIC_FIELDS = ("step", "loss", "grad_norm_vision", "grad_norm_projector", "grad_norm_llm",
                 "tokens", "seconds")
"""Keys every metrics record has. ``step`` counts optimizer steps completed (1 after
the first step), the same count a checkpoint is saved under. ``vlmcp train --model`` adds
``lr``, ``grad_norm`` (the global norm before clipping), ``target_tokens``, ``tokens_per_second``
and ``memory_bytes`` (the busiest rank's peak)."""

EVAL_FIELDS = ("step", "eval_loss", "eval_tokens")
"""Keys of an evaluation record (:meth:`MetricsWriter.write_eval`): the held-out loss after
``step`` steps; it follows that step's record."""


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

    def write_eval(self, record: Mapping[str, Any]) -> None:
        """Append an evaluation record (every key of :data:`EVAL_FIELDS`), after its step's record.

        Raises:
            ValueError: for a missing key, or a step before the last written one.
        """
        missing = [k for k in EVAL_FIELDS if k not in record]
        if missing:
            raise ValueError(f"eval record lacks {missing}; every eval record needs {list(EVAL_FIELDS)}")
        step = int(record["step"])
        if self.last_step is not None and step < self.last_step:
            raise ValueError(f"eval step {step} is before the last written step {self.last_step}")
        self._file.write(json.dumps({k: _json_value(v) for k, v in record.items()}, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
