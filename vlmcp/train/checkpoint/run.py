"""A run's checkpoints: what one holds, which one a run resumes from, and whether it may.

Two kinds, by :attr:`~vlmcp.train.config.TrainConfig.dcp_checkpoints`:

* every rank holds the whole model: the atomic, checksummed single file of
  :mod:`~vlmcp.train.checkpoint.files` (Note [vlmcp checkpoints: atomic write, newest good file
  wins]) with the layout-free state of :mod:`~vlmcp.train.checkpoint.state`, so it resumes at
  another CP size;
* with FSDP each rank holds a shard: a ``torch.distributed.checkpoint`` directory ``step_N/``
  with ``vlmcp_meta.pt`` (:mod:`~vlmcp.train.checkpoint.dcp`; Note [vlmcp DCP checkpoints: atomic
  and durable]); it resumes at another CP or DP size.

Both keep the newest ``--save-total-limit`` (0 keeps all) and carry the step, the data position
(where the spec's data source continues), the run's config, rank 0's RNG state
(:mod:`~vlmcp.train.checkpoint.rng`) and the record of the frozen parameters they leave out
(:mod:`~vlmcp.train.checkpoint.frozen`). The reference VLM's files of vlmcp 0.1 (no step, no
frozen record in the state) load as they are. A resume must keep what its config's
:meth:`~vlmcp.train.config.TrainConfig.resume_changes` names; a change is refused, naming it
(:func:`check_resumable`). On resume the newest checkpoint that passes its checksums wins (rank 0
chooses; every rank checks it sees that one); a damaged one is skipped with a warning naming the
file (:func:`latest_step`). A DCP checkpoint that would unpickle anything but checkpoint data is
refused outright, naming the file, before any state is loaded, on every rank (Note [vlmcp DCP
checkpoints are unpickled through an allow-list]).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.train.checkpoint.dcp import META, dcp_dirs, dcp_meta, load_dcp, save_dcp
from vlmcp.train.checkpoint.files import (
    checkpoint_path,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
    save_checkpoint,
)
from vlmcp.train.checkpoint.frozen import check_frozen, frozen_record
from vlmcp.train.checkpoint.rng import capture_rng_state, restore_rng_state
from vlmcp.train.checkpoint.state import full_state, load_full_state

__all__ = ["check_resumable", "checkpoint_count", "latest_step", "load_run_checkpoint", "save_run_checkpoint"]


def checkpoint_count(directory: str | os.PathLike, fsdp: bool) -> int:
    """How many checkpoints ``directory`` holds, good or not: DCP directories with ``fsdp``, else files."""
    return len(dcp_dirs(Path(directory))) if fsdp else len(list_checkpoints(directory))


def latest_step(directory: str | os.PathLike, fsdp: bool) -> tuple[int, dict] | None:
    """``(step, saved config)`` of the newest good checkpoint, or None: DCP directories with ``fsdp``
    (:attr:`~vlmcp.train.config.TrainConfig.dcp_checkpoints`), else single files.

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
    from vlmcp.train.checkpoint.dcp_reader import UnsafeCheckpoint

    for step, path in reversed(dcp_dirs(directory)):
        try:
            return step, dcp_meta(path)["config"]
        except UnsafeCheckpoint:
            raise
        except ValueError as err:
            warnings.warn(f"skipping unreadable checkpoint: {err}", stacklevel=2)
    return None


def check_resumable(saved: dict, cfg, step: int, where: Path) -> None:
    """Raise if a checkpoint of step ``step`` and config ``saved`` cannot continue the run ``cfg``."""
    changed = cfg.resume_changes(saved)
    if changed:
        raise ValueError(f"cannot resume from {where}: it belongs to another run ({', '.join(changed)})")
    if step > cfg.steps:
        raise ValueError(f"cannot resume from {where}: its step {step} is past --steps {cfg.steps}")


def save_run_checkpoint(cfg, model: nn.Module, optimizer, step: int, position: int,
                        world: dist.ProcessGroup, cp_group: dist.ProcessGroup) -> Path:
    """Write the checkpoint of ``step`` into ``cfg.checkpoints`` (a collective: every rank calls it)."""
    directory = cfg.checkpoints
    meta = {"step": step, "data_position": position, "config": cfg.to_dict(), "rng": capture_rng_state()}
    meta["frozen"] = frozen_record(model, world)  # left out: --resume takes them from the model it loads
    if cfg.dcp_checkpoints:
        return save_dcp(cfg, model, optimizer, step, meta, world, cp_group)
    state = full_state(model, optimizer, cp_group)
    for name in meta["frozen"]["names"]:
        del state["model"][name]
    if dist.get_rank(world) == 0:
        state.update(meta)
        save_checkpoint(directory, step, state, keep_last=cfg.save_total_limit or None)
    dist.barrier(group=world)
    return checkpoint_path(directory, step)


def load_run_checkpoint(cfg, model: nn.Module, optimizer, world: dist.ProcessGroup,
                        device: torch.device) -> tuple[int, int]:
    """Load the newest good checkpoint on every rank; returns ``(step, data position)``, ``(0, 0)`` if
    there is none (a collective)."""
    step = _agree_on_step(cfg, world, device)
    if step < 0:
        return 0, 0
    directory = Path(cfg.checkpoints)
    if cfg.dcp_checkpoints:
        meta = torch.load(directory / f"step_{step:08d}" / META, weights_only=True)  # every rank checked it
        state = None
    else:
        state = load_checkpoint(checkpoint_path(directory, step)).state  # checks the checksum on every rank
        meta = state
    check_resumable(meta["config"], cfg, step, directory)
    frozen = check_frozen(meta["frozen"], model, world, directory) if "frozen" in meta else []
    if cfg.dcp_checkpoints:
        load_dcp(model, optimizer, directory / f"step_{step:08d}", set(frozen), world)
    else:
        params = dict(model.named_parameters())
        for name in frozen:  # the frozen weights come from the model loaded again (checked), not the file
            state["model"][name] = params[name].detach()
        load_full_state(model, optimizer, state)
    if "rng" in meta:
        restore_rng_state(meta["rng"])
    return step, int(meta["data_position"])


def _agree_on_step(cfg, world: dist.ProcessGroup, device: torch.device) -> int:
    """The step every rank resumes from (-1: none), rank 0's choice, after every rank checked that it
    sees that checkpoint (a directory that is not shared would let ranks continue from different
    states and wait forever for each other) and, for DCP, that it unpickles nothing unsafe."""
    from vlmcp.train.checkpoint.dcp_reader import UnsafeCheckpoint, check_dcp_checkpoint

    directory, dcp = Path(cfg.checkpoints), cfg.dcp_checkpoints
    found, refused = None, None
    if dist.get_rank(world) == 0:  # reads and checks the checkpoints once; the others take its choice
        with warnings.catch_warnings():  # the command line reported damaged ones before the ranks started
            warnings.simplefilter("ignore")
            try:
                found = latest_step(directory, dcp)
            except UnsafeCheckpoint as err:  # every rank stops with it; none waits for rank 0
                refused = err
    step = torch.tensor([-2 if refused else -1 if found is None else found[0]], dtype=torch.float64,
                        device=device)
    dist.broadcast(step, src=dist.get_global_rank(world, 0), group=world)
    step = int(step)
    if step == -2:
        raise refused or UnsafeCheckpoint(f"{directory}: rank 0 refused a checkpoint (its line names the "
                                          "file); nothing was loaded")
    there = directory / f"step_{step:08d}" / META if dcp else checkpoint_path(directory, step)
    refused = None
    if dcp and step >= 0:  # every rank checks what it will unpickle itself, before loading anything
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
    return step
