"""Training support: atomic checkpoints, progress display and metrics.

Main entry points:

* :func:`save_checkpoint`, :func:`load_checkpoint`, :func:`latest_checkpoint`,
  :func:`load_latest_checkpoint`: atomic checkpoints (see Note [vlmcp checkpoints:
  atomic write, newest good file wins] in :mod:`vlmcp.train.reference.checkpoint`);
  :func:`capture_rng_state` / :func:`restore_rng_state` for exact resume.
* :class:`ProgressBar` (rank 0's terminal) and :class:`MetricsWriter` /
  :func:`read_metrics` (one JSON object per step, resumable without duplicates).
"""

from vlmcp.train.progress import METRIC_FIELDS, MetricsWriter, ProgressBar, format_duration, read_metrics
from vlmcp.train.reference.checkpoint import (
    Checkpoint,
    capture_rng_state,
    checkpoint_path,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
    restore_rng_state,
    save_checkpoint,
)

__all__ = [
    "METRIC_FIELDS", "Checkpoint", "MetricsWriter", "ProgressBar", "capture_rng_state",
    "checkpoint_path", "format_duration", "latest_checkpoint", "list_checkpoints", "load_checkpoint",
    "load_latest_checkpoint", "read_metrics", "restore_rng_state", "save_checkpoint",
]
