"""Atomic, checksummed single-file checkpoints: a whole run's state in one file per step.

Note [vlmcp checkpoints: atomic write, newest good file wins]
-------------------------------------------------------------
A checkpoint of step N is the file ``step_{N:08d}.pt`` in the checkpoint directory.
It is written under a hidden temporary name in the same directory, flushed and
fsynced, and only then renamed over its final name with ``os.replace`` (atomic on
POSIX within one file system); the directory is fsynced so the rename survives a
power cut::

    .step_00000200.pt.tmp-<pid>-<host>   <- torch.save, flush, fsync  (crash here: ignored)
    step_00000200.pt                     <- os.replace                (visible, complete)

The temporary file is created with ``O_EXCL | O_NOFOLLOW``
(:func:`vlmcp.train.checkpoint.durable.open_exclusive`): its name is predictable, and a symlink planted
there would otherwise make the save write wherever it points.

A crash at any point leaves either the old set of checkpoints or the old set plus a
complete new one; a partial temporary file never matches ``step_*.pt``, so it can
never shadow the last good checkpoint. Temporary names carry their writer (pid and
host): a save deletes only its own leftovers and those of writers on this host that
no longer exist, never the file another live process is writing. Only then are all
but the newest ``keep_last`` checkpoints deleted. One process (the trainer's rank 0)
writes to a directory, and one run at a time (:mod:`vlmcp.train.lock`).

Each file carries the SHA-256 of its payload (the step and every tensor's bytes,
dtype and shape, every other value's ``repr``, in order), checked on load: a bit
flip that the zip container does not notice (torch does not check its CRCs) is a
:class:`ValueError` naming the file, and :func:`load_latest_checkpoint` falls back
to the previous checkpoint with a warning. Files of format version 1 (before
checksums) still load, unchecked.
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vlmcp.train.checkpoint.durable import clean_os_error, fsync_dir, open_exclusive, remove_stale_temps
from vlmcp.train.lock import writer_tag

__all__ = ["Checkpoint", "checkpoint_path", "latest_checkpoint", "list_checkpoints", "load_checkpoint",
           "load_latest_checkpoint", "payload_digest", "save_checkpoint"]

_FORMAT = "vlmcp.checkpoint"
_VERSION = 2  # 2: with "sha256"
_READS = (1, 2)
_NAME = re.compile(r"^step_(\d{8,})\.pt$")
_TEMP = re.compile(r"^\.step_\d{8,}\.pt\.tmp-(\d+)-(.*)$")


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint.

    Attributes:
        path: the file it was read from.
        step: optimizer steps completed when it was saved.
        state: the state dict given to :func:`save_checkpoint`.
    """

    path: Path
    step: int
    state: dict[str, Any]


def checkpoint_path(directory: str | os.PathLike, step: int) -> Path:
    """Final path of the checkpoint of ``step`` in ``directory``."""
    return Path(directory) / f"step_{step:08d}.pt"


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Complete checkpoints in ``directory``, oldest step first ([] if it does not exist)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The checkpoint with the highest step in ``directory``, or None."""
    found = list_checkpoints(directory)
    return found[-1] if found else None


def payload_digest(obj: Any) -> str:
    """SHA-256 (hex) of a checkpoint payload: tensors by dtype, shape and bytes, dicts, lists and
    tuples in order, every other value by its ``repr``. Equal for a payload and its reload."""
    h = hashlib.sha256()

    def walk(x):
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())
        elif isinstance(x, Mapping):
            h.update(f"D{len(x)}".encode())
            for k, v in x.items():
                walk(k)
                walk(v)
        elif isinstance(x, (list, tuple)):
            h.update(f"{type(x).__name__[0]}{len(x)}".encode())
            for v in x:
                walk(v)
        else:
            h.update(f"{type(x).__name__}:{x!r};".encode())

    walk(obj)
    return h.hexdigest()


def save_checkpoint(directory: str | os.PathLike, step: int, state: Mapping[str, Any],
                    keep_last: int | None = 3) -> Path:
    """Write ``state`` as the checkpoint of ``step``, atomically, with its checksum.

    See Note [vlmcp checkpoints: atomic write, newest good file wins].

    Args:
        directory: checkpoint directory (created if missing).
        step: optimizer steps completed (>= 0).
        state: what to save, e.g. ``{"model": ..., "optimizer": ..., "rng":
            capture_rng_state(), "data_position": ..., "config": asdict(cfg)}``.
            Use tensors, numbers, strings, lists, tuples and dicts only, so that
            :func:`load_checkpoint` can read it with ``weights_only=True``.
        keep_last: keep only the newest ``keep_last`` checkpoints; None keeps all.

    Returns:
        The final path.

    Raises:
        OSError: the file cannot be written (e.g. a full disk): one line naming the file and
            the reason; the previous checkpoints stay as they were.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int)
                                  or keep_last < 1):
        raise ValueError(f"keep_last must be None or an int >= 1, got {keep_last!r}")
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a mapping, got {type(state).__name__}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(directory, step)
    temp = directory / f".{final.name}.tmp-{writer_tag()}"
    state = dict(state)
    payload = {"format": _FORMAT, "version": _VERSION, "step": step,
               "sha256": payload_digest((step, state)), "state": state}
    try:
        with open_exclusive(temp) as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, final)
    except BaseException as err:
        temp.unlink(missing_ok=True)
        clean = clean_os_error(err, f"checkpoint {final}") if isinstance(err, Exception) else None
        if clean is not None:
            raise clean from None
        raise
    fsync_dir(directory)
    remove_stale_temps(directory, _TEMP)  # partial files of earlier, crashed saves
    if keep_last is not None:
        for old in list_checkpoints(directory)[:-keep_last]:
            old.unlink(missing_ok=True)
    return final


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint` and verify its checksum.

    Always with ``torch.load(weights_only=True)``: a pickled object other than plain data is an
    error, never run (a checkpoint directory may be writable by others; the checksum would
    not tell, its writer can recompute it).

    Args:
        path: the checkpoint file.
        map_location: where tensors go (CPU by default, so a checkpoint from GPUs loads
            anywhere; move the model afterwards).

    Raises:
        ValueError: if the file is not a vlmcp checkpoint, cannot be read, or its contents
            do not match its checksum (the message names the file).
    """
    path = Path(path)
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise  # a wrong path is the caller's mistake, not a damaged file
    except Exception as err:
        raise ValueError(f"cannot read checkpoint {path}: {type(err).__name__}: {err}") from err
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
        raise ValueError(f"{path} is not a vlmcp checkpoint")
    if payload.get("version") not in _READS:
        raise ValueError(f"{path} has checkpoint version {payload.get('version')!r}, "
                         f"this vlmcp reads versions {', '.join(map(str, _READS))}")
    try:
        step, state = int(payload["step"]), payload["state"]
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"cannot read checkpoint {path}: {type(err).__name__}: {err}") from err
    if payload["version"] >= 2 and payload.get("sha256") != payload_digest((step, state)):
        raise ValueError(f"checkpoint {path} is damaged: its contents do not match its checksum")
    return Checkpoint(path=path, step=step, state=state)


def load_latest_checkpoint(directory: str | os.PathLike,
                           map_location: str | torch.device = "cpu") -> Checkpoint | None:
    """Load the newest good checkpoint of ``directory``, or None if there is none.

    A checkpoint that cannot be read or fails its checksum (damaged after it was
    written: a full disk elsewhere, a bad sector, a manual copy) is skipped with a
    warning naming the file, and the one before it is tried. Whether *no* checkpoint
    means a fresh start is the caller's decision (``vlmcp train --resume`` refuses to
    start over when files exist but none is good).
    """
    for path in reversed(list_checkpoints(directory)):
        try:
            return load_checkpoint(path, map_location)
        except ValueError as err:
            warnings.warn(f"skipping unreadable checkpoint: {err}", stacklevel=2)
    return None


