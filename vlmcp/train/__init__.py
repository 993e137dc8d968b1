"""Training: what both trainers share, and each trainer's own loop.

The shared layer (this package's modules):

* :mod:`.checkpoint` — atomic checkpoints, newest good file wins (Note [vlmcp checkpoints:
  atomic write, newest good file wins]); :func:`capture_rng_state` / :func:`restore_rng_state`
  for exact resume; :mod:`.state` — the full (layout-free) training state.
* :mod:`.schedule` — the learning rate as a pure function of the step.
* :mod:`.groups` — :func:`dp_cp_groups`, the DP x CP process groups.
* :mod:`.options` — the option types (``Literal`` choices, dtypes).
* :mod:`.progress` — :class:`ProgressBar`; the metrics JSONL is :mod:`vlmcp.report.metrics`.
* :mod:`.lock` — one run per directory; :mod:`.faults` — stalled peers, orphaned ranks;
  :mod:`.stop` — SIGTERM and Ctrl-C.

The trainers: :mod:`.reference` (the built-in VLM, ``vlmcp train``) and :mod:`.hf` (a Hugging
Face model directory, ``vlmcp train --model``); each keeps only its config, step and loop.
"""

from vlmcp.report.metrics import METRIC_FIELDS, MetricsWriter, read_metrics
from vlmcp.train.checkpoint import (
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
from vlmcp.train.groups import dp_cp_groups
from vlmcp.train.progress import ProgressBar, format_duration
from vlmcp.train.schedule import lr_at

__all__ = [
    "METRIC_FIELDS", "Checkpoint", "MetricsWriter", "ProgressBar", "capture_rng_state",
    "checkpoint_path", "dp_cp_groups", "format_duration", "latest_checkpoint", "list_checkpoints",
    "load_checkpoint", "load_latest_checkpoint", "lr_at", "read_metrics", "restore_rng_state",
    "save_checkpoint",
]
