"""Checkpoints of ``vlmcp train --model``.

Two kinds, by ``--fsdp``:

* without FSDP every rank holds the whole model: the atomic, checksummed single file of
  :mod:`vlmcp.train.checkpoint` (Note [vlmcp checkpoints: atomic write, newest good file
  wins]) with the layout-free state of :mod:`vlmcp.train.state`, so it resumes at another
  CP size;
* with FSDP each rank holds a shard: a ``torch.distributed.checkpoint`` directory
  ``step_N/`` with ``vlmcp_meta.pt`` (:mod:`vlmcp.train.hf.dcp_checkpoint`; Note [vlmcp DCP
  checkpoints: atomic and durable]); it resumes at another CP or DP size.

Both keep the newest ``--save-total-limit`` (default 3; 0 keeps all) and carry the data
position (rows consumed) for an exact resume. A resume must keep the run's data, model and
schedule (``--steps``, ``--grad-accum``, ``--lr`` and its scheduler and warm-up): a change is
refused, naming it (:func:`check_resumable`).
On resume the newest checkpoint that passes its checksums wins; a damaged one is skipped
with a warning naming the file (:func:`latest_step`). A DCP checkpoint that would unpickle
anything but checkpoint data is refused outright, naming the file, before any state is
loaded, on every rank (Note [vlmcp DCP checkpoints are unpickled through an allow-list]).

The final ``save_pretrained`` directory is a checkpoint too: :mod:`vlmcp.train.hf.final_model`.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.train.checkpoint import (
    checkpoint_path,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
    save_checkpoint,
)
from vlmcp.train.hf.dcp_checkpoint import META, dcp_dirs, dcp_meta, load_dcp, save_dcp
from vlmcp.train.hf.finetune import check_frozen, frozen_record
from vlmcp.train.hf.finetune_config import finetune_changes
from vlmcp.train.state import full_state, load_full_state

__all__ = ["check_resumable", "checkpoint_count", "latest_step", "load_hf_checkpoint", "save_hf_checkpoint"]

_RESUME_FIELDS = ("model", "data", "seq_len", "seed", "dtype", "image_root", "video",
                  # what the rows are made of (a checkpoint from before these fields holds their defaults)
                  "dataset", "dataset_dir", "max_samples", "image_max_pixels", "image_min_pixels", "truncate")
_SCHEDULE_FIELDS = ("steps", "grad_accum", "lr", "lr_scheduler", "warmup_steps", "warmup_ratio",
                    "weight_decay")  # the optimizer state keeps its weight decay
"""Checked where the checkpoint has them (older checkpoints: ``steps`` only)."""
_PATH_FIELDS = ("model", "data", "image_root", "dataset_dir")


def checkpoint_count(directory: str | os.PathLike, fsdp: bool) -> int:
    """How many checkpoints of the kind ``fsdp`` writes ``directory`` holds, good or not."""
    return len(dcp_dirs(Path(directory))) if fsdp else len(list_checkpoints(directory))


def latest_step(directory: str | os.PathLike, fsdp: bool) -> tuple[int, dict] | None:
    """``(step, saved config)`` of the newest good checkpoint of the kind ``fsdp`` writes, or None.

    Every checksum is checked (the whole checkpoint is read); a checkpoint that fails is
    skipped with a warning naming the file, and the one before it is tried.

    Raises:
        UnsafeCheckpoint: a DCP checkpoint would unpickle something a checkpoint never holds:
            never skipped (a crafted file is no accident, and nothing older can be trusted more).
    """
    directory = Path(directory)
    if not fsdp:
        ckpt = load_latest_checkpoint(directory)
        return None if ckpt is None else (ckpt.step, ckpt.state["config"])
    from vlmcp.train.hf.dcp_reader import UnsafeCheckpoint

    for step, path in reversed(dcp_dirs(directory)):
        try:
            return step, dcp_meta(path)["config"]
        except UnsafeCheckpoint:
            raise
        except ValueError as err:
            warnings.warn(f"skipping unreadable checkpoint: {err}", stacklevel=2)
    return None


def _same(field: str, a, b) -> bool:
    """Paths compare resolved (``data/x.jsonl`` is ``/work/data/x.jsonl`` from /work)."""
    if field in _PATH_FIELDS and a is not None and b is not None:
        # --data is a list of files since it may be repeated; older checkpoints hold one string
        resolve = lambda v: [os.path.realpath(x) for x in ([v] if isinstance(v, str) else v)]
        return resolve(a) == resolve(b)
    if dataclasses.is_dataclass(b) and not isinstance(b, type):  # saved as to_dict() made it
        b = dataclasses.asdict(b)
    return a == b


def check_resumable(saved: dict, cfg, step: int, where: Path) -> None:
    """Raise if a checkpoint of ``saved`` config cannot continue the run ``cfg``."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    fields = _RESUME_FIELDS + tuple(f for f in _SCHEDULE_FIELDS if f in saved)
    changed = [f"--{f.replace('_', '-')} {saved.get(f, defaults.get(f))!r} -> {getattr(cfg, f)!r}"
               for f in fields if not _same(f, saved.get(f, defaults.get(f)), getattr(cfg, f))]
    if saved.get("fsdp") != cfg.fsdp:
        changed.append(f"--fsdp {saved.get('fsdp')} -> {cfg.fsdp}")
    changed += finetune_changes(saved, cfg)
    if changed:
        raise ValueError(f"cannot resume from {where}: it belongs to another run ({', '.join(changed)})")
    if step > cfg.steps:
        raise ValueError(f"cannot resume from {where}: its step {step} is past --steps {cfg.steps}")


def save_hf_checkpoint(cfg, model: nn.Module, optimizer, step: int, position: int,
                       world: dist.ProcessGroup, cp_group: dist.ProcessGroup) -> Path:
    """Write the checkpoint of ``step`` (a collective: every rank calls it)."""
    directory = cfg.checkpoints
    meta = {"step": step, "data_position": position, "config": cfg.to_dict()}
    rank = dist.get_rank(world)
    meta["frozen"] = frozen_record(model, world)  # left out: --resume takes them from --model
    if not cfg.fsdp:
        state = full_state(model, optimizer, cp_group)
        for name in meta["frozen"]["names"]:
            del state["model"][name]
        path = Path(directory) / f"step_{step:08d}.pt"
        if rank == 0:
            state.update(meta)
            save_checkpoint(directory, step, state, keep_last=cfg.save_total_limit or None)
        dist.barrier(group=world)
        return path
    return save_dcp(cfg, model, optimizer, step, meta, world, cp_group)


def load_hf_checkpoint(cfg, model: nn.Module, optimizer, world: dist.ProcessGroup,
                       device: torch.device) -> tuple[int, int]:
    """Load the newest checkpoint on every rank; returns ``(step, data position)``, ``(0, 0)`` if none.

    Ranks must agree on the step (a directory that is not shared would let them
    continue from different states and wait forever for each other).
    """
    from vlmcp.train.hf.dcp_reader import UnsafeCheckpoint, check_dcp_checkpoint

    directory = Path(cfg.checkpoints)
    rank = dist.get_rank(world)
    found, refused = None, None
    if rank == 0:  # reads and checks the checkpoints once; the others take its choice
        with warnings.catch_warnings():  # the command line reported damaged ones before the ranks started
            warnings.simplefilter("ignore")
            try:
                found = latest_step(directory, cfg.fsdp)
            except UnsafeCheckpoint as err:  # every rank stops with it; none waits for rank 0
                refused = err
    step = torch.tensor([-2 if refused else -1 if found is None else found[0]], dtype=torch.float64,
                        device=device)
    dist.broadcast(step, src=dist.get_global_rank(world, 0), group=world)
    step = int(step)
    if step == -2:
        raise refused or UnsafeCheckpoint(f"{directory}: rank 0 refused a checkpoint (its line names the "
                                          "file); nothing was loaded")
    there = checkpoint_path(directory, step) if not cfg.fsdp else directory / f"step_{step:08d}" / META
    refused = None
    if cfg.fsdp and step >= 0:  # every rank checks what it will unpickle itself, before loading anything
        try:
            check_dcp_checkpoint(there.parent)
        except ValueError as err:
            refused = err
    have = torch.tensor([float(step < 0 or there.is_file()), float(refused is None)], dtype=torch.float64,
                        device=device)
    dist.all_reduce(have, op=dist.ReduceOp.MIN, group=world)
    if not bool(have[0]):
        raise RuntimeError(f"rank 0 resumes from step {step} in {directory}, but some rank does not see "
                           "that checkpoint; is the directory shared by every rank?")
    if not bool(have[1]):
        raise refused or UnsafeCheckpoint(f"{there.parent}: another rank refused this checkpoint (its line "
                                          "names the file); nothing was loaded")
    if step < 0:
        return 0, 0
    if not cfg.fsdp:
        ckpt = load_checkpoint(checkpoint_path(directory, step))  # checks the checksum on every rank
        check_resumable(ckpt.state["config"], cfg, step, directory)
        if "frozen" in ckpt.state:  # the frozen weights come from --model (checked), not the file
            params = dict(model.named_parameters())
            for name in check_frozen(ckpt.state["frozen"], model, world, directory):
                ckpt.state["model"][name] = params[name].detach()
        load_full_state(model, optimizer, ckpt.state)
        return ckpt.step, int(ckpt.state["data_position"])
    meta = torch.load(directory / f"step_{step:08d}" / META, weights_only=True)  # every rank checked it
    check_resumable(meta["config"], cfg, step, directory)
    frozen = set(check_frozen(meta["frozen"], model, world, directory)) if "frozen" in meta else set()
    load_dcp(model, optimizer, directory / f"step_{step:08d}", frozen, world)
    return int(meta["step"]), int(meta["data_position"])
