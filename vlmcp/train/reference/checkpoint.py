"""Atomic training checkpoints, and the RNG state they must carry for exact resume.

Note [vlmcp checkpoints: atomic write, newest good file wins]
-------------------------------------------------------------
A checkpoint of step N is the file ``step_{N:08d}.pt`` in the checkpoint directory.
It is written under a hidden temporary name in the same directory, flushed and
fsynced, and only then renamed over its final name with ``os.replace`` (atomic on
POSIX within one file system); the directory is fsynced so the rename survives a
power cut::

    .step_00000200.pt.tmp-<pid>   <- torch.save, flush, fsync     (crash here: ignored)
    step_00000200.pt              <- os.replace                    (visible, complete)

A crash at any point leaves either the old set of checkpoints or the old set plus a
complete new one; a partial temporary file never matches ``step_*.pt``, so it can
never shadow the last good checkpoint, and the next successful save deletes it.
Only then are all but the newest ``keep_last`` checkpoints deleted. One process (the
trainer's rank 0) writes to a directory.
"""

from __future__ import annotations

import os
import random
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "Checkpoint", "capture_rng_state", "checkpoint_path", "latest_checkpoint", "list_checkpoints",
    "load_checkpoint", "load_latest_checkpoint", "restore_rng_state", "save_checkpoint",
]

_FORMAT = "vlmcp.checkpoint"
_VERSION = 1
_NAME = re.compile(r"^step_(\d{8,})\.pt$")
_TEMP = re.compile(r"^\.step_\d{8,}\.pt\.tmp-")


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


def _fsync_dir(directory: Path) -> None:
    # Makes the rename durable; not every platform can open a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(directory: str | os.PathLike, step: int, state: Mapping[str, Any],
                    keep_last: int | None = 3) -> Path:
    """Write ``state`` as the checkpoint of ``step``, atomically.

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
    temp = directory / f".{final.name}.tmp-{os.getpid()}"
    payload = {"format": _FORMAT, "version": _VERSION, "step": step, "state": dict(state)}
    try:
        with open(temp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, final)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_dir(directory)
    for p in directory.iterdir():  # partial files of earlier, crashed saves
        if _TEMP.match(p.name):
            p.unlink(missing_ok=True)
    if keep_last is not None:
        for old in list_checkpoints(directory)[:-keep_last]:
            old.unlink(missing_ok=True)
    return final


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    weights_only: bool = True) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Args:
        path: the checkpoint file.
        map_location: where tensors go (CPU by default, so a checkpoint from GPUs loads
            anywhere; move the model afterwards).
        weights_only: refuse arbitrary pickled objects (safe for files from elsewhere).

    Raises:
        ValueError: if the file is not a vlmcp checkpoint or cannot be read.
    """
    path = Path(path)
    try:
        payload = torch.load(path, map_location=map_location, weights_only=weights_only)
    except FileNotFoundError:
        raise  # a wrong path is the caller's mistake, not a damaged file
    except Exception as err:
        raise ValueError(f"cannot read checkpoint {path}: {type(err).__name__}: {err}") from err
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
        raise ValueError(f"{path} is not a vlmcp checkpoint")
    if payload.get("version") != _VERSION:
        raise ValueError(f"{path} has checkpoint version {payload.get('version')!r}, "
                         f"this vlmcp reads version {_VERSION}")
    return Checkpoint(path=path, step=int(payload["step"]), state=payload["state"])


def load_latest_checkpoint(directory: str | os.PathLike,
                           map_location: str | torch.device = "cpu") -> Checkpoint | None:
    """Load the newest readable checkpoint of ``directory``, or None if there is none.

    A checkpoint that cannot be read (damaged after it was written, e.g. by a full
    disk elsewhere or a manual copy) is skipped with a warning, and the one before it
    is tried.
    """
    for path in reversed(list_checkpoints(directory)):
        try:
            return load_checkpoint(path, map_location)
        except ValueError as err:
            warnings.warn(f"skipping unreadable checkpoint: {err}", stacklevel=2)
    return None


def capture_rng_state() -> dict[str, Any]:
    """RNG states of python ``random``, numpy's global generator, torch CPU and CUDA.

    Returns:
        A dict of tensors, ints and tuples (loadable with ``weights_only=True``).
        ``vlmcp train`` saves rank 0's state and restores it on every rank: it draws no
        random numbers after initialization. A model with dropout, which differs per
        rank, would need every rank's state gathered instead.
    """
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                  float(cached)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`capture_rng_state` captured.

    A CUDA state is restored only when this process sees the same number of GPUs;
    otherwise it is skipped with a warning (the CPU streams are still exact).
    """
    random.setstate(_as_tuples(state["python"]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.int64).astype(np.uint32), int(pos),
                         int(has_gauss), float(cached)))
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        if torch.cuda.is_available() and torch.cuda.device_count() == len(state["cuda"]):
            torch.cuda.set_rng_state_all(state["cuda"])
        else:
            warnings.warn("checkpoint holds CUDA RNG states for a different set of GPUs; "
                          "not restoring them", stacklevel=2)


def _as_tuples(value):
    # random.setstate needs tuples; a state that went through JSON or a list-only
    # serializer comes back as lists.
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value
