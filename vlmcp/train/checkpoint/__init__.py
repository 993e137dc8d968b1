"""Checkpoints: a run's state on disk, written so that no crash or planted file corrupts a run.

One concept per module:

* :mod:`.files` — atomic, checksummed single files, newest good file wins (Note [vlmcp
  checkpoints: atomic write, newest good file wins]): :func:`save_checkpoint`,
  :func:`load_checkpoint`, :func:`load_latest_checkpoint`;
* :mod:`.dcp` — FSDP's ``torch.distributed.checkpoint`` directories, atomic and durable (Note
  [vlmcp DCP checkpoints: atomic and durable]), read through :mod:`.dcp_reader`'s allow-list
  (Note [vlmcp DCP checkpoints are unpickled through an allow-list]);
* :mod:`.durable` — the file primitives: exclusive temporaries, fsyncs, directories published
  and retired whole, crashed saves' debris;
* :mod:`.state` — model and optimizer state in a layout-free form (slices gathered full size);
* :mod:`.rng` — the RNG state for an exact resume; :mod:`.frozen` — the frozen weights a
  checkpoint leaves out;
* :mod:`.run` — a run's checkpoints: what one holds, which one a run resumes from
  (:func:`load_run_checkpoint`), and whether it may (:func:`check_resumable`).
"""

from vlmcp.train.checkpoint.files import (
    Checkpoint,
    checkpoint_path,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
    payload_digest,
    save_checkpoint,
)
from vlmcp.train.checkpoint.rng import capture_rng_state, restore_rng_state

__all__ = ["Checkpoint", "capture_rng_state", "checkpoint_path", "latest_checkpoint", "list_checkpoints",
           "load_checkpoint", "load_latest_checkpoint", "payload_digest", "restore_rng_state",
           "save_checkpoint"]
