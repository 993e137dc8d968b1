"""Training: one loop for every model family, on shared components (after torchtitan's trainer).

* :func:`train_rank` (:mod:`.loop`) — the loop on every rank of a DP x CP world, for any
  :class:`TrainSpec` (:mod:`.spec`): the built-in reference VLM
  (:mod:`.specs.reference`) or a Hugging Face model directory (:mod:`.specs.hf`);
* :mod:`.step` — one optimizer step as named steps and its one all-reduce (Note [vlmcp HF global
  batch: one normaliser]); :mod:`.optim` — AdamW, the exact global norm, clipping;
  :mod:`.schedule` — :func:`lr_at`; :mod:`.evaluate` — the held-out loss;
* :class:`TrainConfig` (:mod:`.config`) — the loop's fields, which each spec's config extends;
* :mod:`.checkpoint` — atomic single files and FSDP's DCP directories, a run's resume (Note
  [vlmcp checkpoints: atomic write, newest good file wins]);
* :mod:`.feedback` and :mod:`.progress` — the progress line, the metrics
  (:mod:`vlmcp.report.metrics`), TensorBoard; :mod:`.groups` — :func:`dp_cp_groups`;
  :mod:`.options` — the option types; :mod:`.lock` — one run per directory; :mod:`.faults` —
  stalled peers, orphaned ranks; :mod:`.stop` — SIGTERM and Ctrl-C.
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
from vlmcp.train.config import TrainConfig
from vlmcp.train.groups import dp_cp_groups
from vlmcp.train.loop import train_rank
from vlmcp.train.progress import ProgressBar, format_duration
from vlmcp.train.schedule import lr_at
from vlmcp.train.spec import TrainSpec

__all__ = [
    "METRIC_FIELDS", "Checkpoint", "MetricsWriter", "ProgressBar", "TrainConfig", "TrainSpec",
    "capture_rng_state", "checkpoint_path", "dp_cp_groups", "format_duration", "latest_checkpoint",
    "list_checkpoints", "load_checkpoint", "load_latest_checkpoint", "lr_at", "read_metrics",
    "restore_rng_state", "save_checkpoint", "train_rank",
]

