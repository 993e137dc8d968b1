"""FSDP checkpoints (``vlmcp train --fsdp``): ``torch.distributed.checkpoint`` directories.

Each rank holds a shard: DCP writes every rank's shard into ``.step_N.tmp-<pid>-<host>/`` (on a
directory all ranks share; rank 0 names it), rank 0 adds ``vlmcp_meta.pt`` (step, data
position, config, the SHA-256 of every file and of the meta itself) and renames it to
``step_N/`` only after every rank finished. DCP stores tensors by name with their global
shapes, so a run resumes at another CP or DP size. Reading goes through
:mod:`vlmcp.train.checkpoint.dcp_reader` (Note [vlmcp DCP checkpoints are unpickled through an
allow-list]); which checkpoint a run resumes from, and the checks every rank agrees on, are
:mod:`vlmcp.train.checkpoint.run`'s.

Note [vlmcp DCP checkpoints: atomic and durable]
------------------------------------------------
A save of step N, and what a crash at each point leaves (``latest_step`` sees only
``step_*`` directories holding a ``vlmcp_meta.pt``)::

    .step_N.tmp-<pid>-<host>/   <- dcp.save, each rank fsyncs its files    (crash: hidden debris)
                                <- rank 0: vlmcp_meta.pt (O_EXCL, fsync), fsync of every file
                                   and of the directory                    (crash: hidden debris)
    step_N/ (an old one)        -> .step_N.old-<pid>-<host>/                (crash: N-1 is newest)
    .step_N.tmp-...             -> step_N/, fsync of the parent             (crash: N, complete)
    .step_N.old-...             deleted
    step_K/ beyond --save-total-limit -> .step_K.old-.../, fsync, deleted   (crash: K hidden)

Nothing visible is ever deleted in place (``rmtree`` of a visible ``step_K`` that a crash
interrupts would leave a damaged checkpoint under its name), and no rename is trusted before
the directory holding it is fsynced. An old ``step_N`` exists only when the newest good
checkpoint was older (it was damaged: a resume starts after its newest good checkpoint).
Debris carries its writer and goes with the next save (:func:`remove_stale_temps`).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.grads import local_part, partition_of
from vlmcp.train.checkpoint.durable import (
    clean_os_error,
    open_exclusive,
    publish_dir,
    remove_stale_temps,
    retire_dir,
)
from vlmcp.train.checkpoint.files import payload_digest
from vlmcp.train.lock import writer_tag

__all__ = ["META", "dcp_dirs", "dcp_meta", "file_sha256", "gather_slice", "load_dcp", "partitioned_params",
           "publish_dcp", "save_dcp"]

_DIR = re.compile(r"^step_(\d{8,})$")
TEMP = re.compile(r"^\.step_\d{8,}\.(?:tmp|old)-(\d+)-(.*)$")  # being written, or being deleted
META = "vlmcp_meta.pt"


def dcp_dirs(directory: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every published checkpoint in ``directory`` (a ``step_N`` holding its
    meta), oldest first; hidden temporaries and debris are never among them."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir()
             if (m := _DIR.match(p.name)) and (p / META).is_file()]
    return sorted(found)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def dcp_meta(path: Path) -> dict:
    """The meta of the DCP checkpoint ``path`` after checking every checksum it carries.

    Raises:
        UnsafeCheckpoint: a file would unpickle something a checkpoint never holds (see
            :func:`vlmcp.train.checkpoint.dcp_reader.check_dcp_checkpoint`).
        ValueError: naming the file that cannot be read or does not match.
    """
    try:
        meta = torch.load(path / META, weights_only=True)
        body = {k: v for k, v in meta.items() if k != "sha256"}
        step, config = int(meta["step"]), meta["config"]
    except Exception as err:
        raise ValueError(f"cannot read {path / META}: {type(err).__name__}: {err}") from err
    if "sha256" in meta and meta["sha256"] != payload_digest(body):
        raise ValueError(f"{path / META} is damaged: its contents do not match its checksum")
    for name, digest in meta.get("files", {}).items():
        file = path / name
        if not file.is_file() or file_sha256(file) != digest:
            raise ValueError(f"{file} is {'damaged' if file.is_file() else 'missing'}: "
                             "the checkpoint's checksum does not match")
    from vlmcp.train.checkpoint.dcp_reader import check_dcp_checkpoint  # imports torch's DCP: only here

    check_dcp_checkpoint(path)  # the checksums tell damage, not tampering: their writer can recompute them
    return {**body, "step": step, "config": config}


def partitioned_params(model: nn.Module) -> dict[str, nn.Parameter]:
    """``hidden_shard``'s slices by name: kept out of FSDP, different on every CP rank."""
    return {n: p for n, p in model.named_parameters() if partition_of(p) is not None}


def gather_slice(param: nn.Parameter, t: torch.Tensor, cp_group: dist.ProcessGroup) -> torch.Tensor:
    dim, _, size = partition_of(param)
    pieces = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(pieces, t.detach().contiguous(), group=cp_group)
    return torch.cat(pieces, dim=dim)


def _full_slices(model, model_state: dict, optim_state: dict, cp_group) -> tuple[dict, dict]:
    """Copies of FSDP state dicts with the slices full size (DCP keeps one copy of a plain
    tensor, so every CP rank must hold the same one); a collective over the CP group. The
    inner dicts of ``get_state_dict`` are the optimizer's own: never written to."""
    model_state, states = dict(model_state), dict(optim_state["state"])
    for name, p in partitioned_params(model).items():
        model_state[name] = gather_slice(p, model_state[name], cp_group)
        states[name] = {k: gather_slice(p, v, cp_group) if torch.is_tensor(v) and v.dim() > 0 else v
                        for k, v in states.get(name, {}).items()}
    return model_state, {**optim_state, "state": states}


def save_dcp(cfg, model: nn.Module, optimizer, step: int, meta: dict, world: dist.ProcessGroup,
             cp_group: dist.ProcessGroup) -> Path:
    """Write the DCP checkpoint of ``step`` with ``meta`` (a collective: every rank calls it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict

    directory, rank = Path(cfg.checkpoints), dist.get_rank(world)
    final = directory / f"step_{step:08d}"
    name = [f".step_{step:08d}.tmp-{writer_tag()}"]  # rank 0's name, for every rank
    dist.broadcast_object_list(name, src=dist.get_global_rank(world, 0), group=world)
    temp = directory / name[0]
    if rank == 0:
        remove_stale_temps(directory, TEMP)  # crashed earlier saves of this run or dead ones
        temp.mkdir(parents=True)
    dist.barrier(group=world)
    model_state, optim_state = get_state_dict(model, optimizer)
    model_state, optim_state = _full_slices(model, model_state, optim_state, cp_group)
    model_state = {k: v for k, v in model_state.items() if k not in set(meta["frozen"]["names"])}
    try:  # sync_files (torch's default, said here since the note relies on it): each rank fsyncs its own
        dcp.save({"model": model_state, "optimizer": optim_state}, process_group=world,
                 storage_writer=FileSystemWriter(temp, sync_files=True))
    except CheckpointException as err:  # a BaseException holding every rank's error: a full disk is one line
        cleaned = (clean_os_error(e, f"checkpoint {final}") for e, _ in err.failures.values())
        failure = next((f for f in cleaned if f is not None), None)
        if failure is None:
            raise
        raise failure from None
    dist.barrier(group=world)
    if rank == 0:
        meta["files"] = {p.name: file_sha256(p) for p in sorted(temp.iterdir()) if p.is_file()}
        meta["sha256"] = payload_digest(meta)
        publish_dcp(temp, final, meta, cfg.save_total_limit)
    dist.barrier(group=world)
    return final


def publish_dcp(temp: Path, final: Path, meta: dict, keep: int | None) -> None:
    """Rank 0's part of a DCP save: ``vlmcp_meta.pt`` into the complete ``temp``, ``temp`` to ``final``,
    and the checkpoints beyond the newest ``keep`` (None, 0: all kept) deleted, in the order of
    Note [vlmcp DCP checkpoints: atomic and durable]."""
    with open_exclusive(temp / META) as f:
        torch.save(meta, f)
        f.flush()
        os.fsync(f.fileno())
    publish_dir(temp, final)
    for _, old in (dcp_dirs(final.parent)[:-keep] if keep else []):
        retire_dir(old)


def load_dcp(model: nn.Module, optimizer, path: Path, frozen: set[str], world: dist.ProcessGroup) -> None:
    """Load the DCP checkpoint ``path`` (checked by every rank, see
    :func:`vlmcp.train.checkpoint.run.load_run_checkpoint`) into ``model`` and ``optimizer``; the
    ``frozen`` parameters keep their values (a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from vlmcp.train.checkpoint.dcp_reader import SafeLoadPlanner, SafeReader

    model_state, optim_state = get_state_dict(model, optimizer)
    slices = partitioned_params(model)
    full_shape = lambda p, t: [t.shape[d] * partition_of(p)[2] if d == partition_of(p)[0] else t.shape[d]
                               for d in range(t.dim())]
    optim_state = {**optim_state, "state": dict(optim_state["state"])}
    for name, p in slices.items():  # the checkpoint holds them full size (see _full_slices)
        model_state[name] = model_state[name].new_empty(full_shape(p, model_state[name]))
        optim_state["state"][name] = {
            k: v.new_empty(full_shape(p, v)) if torch.is_tensor(v) and v.dim() > 0 else v
            for k, v in optim_state["state"].get(name, {}).items()}
    # a parameter that never had a gradient (a ViT layer the model does not use) has no
    # AdamW state in the checkpoint; the fresh state get_state_dict made for it stays
    optim = {"optimizer": optim_state}
    try:
        # into model_state's own tensors; a frozen one keeps --model's value (checked above). Through
        # the allow-list reader and planner: a file swapped in after the check is refused too
        dcp.load({"model": {k: v for k, v in model_state.items() if k not in frozen}}, checkpoint_id=path,
                 process_group=world, storage_reader=SafeReader(path), planner=SafeLoadPlanner())
        dcp.load(optim, checkpoint_id=path, process_group=world, storage_reader=SafeReader(path),
                 planner=SafeLoadPlanner(allow_partial_load=True))
    except (Exception, CheckpointException) as err:  # checked, yet: a file changed since, or another reader
        if isinstance(err, CheckpointException) and err.failures:  # DCP's wrapper of every rank's error
            err = err.failures[min(err.failures)][0]
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ValueError(f"cannot load checkpoint {path}: {type(err).__name__}: {first}") from None
    for name, p in slices.items():  # this rank's slice, at this run's CP size
        model_state[name] = local_part(p, model_state[name]).clone()
        for k, v in optim["optimizer"]["state"].get(name, {}).items():
            if torch.is_tensor(v) and v.dim() > 0:
                optim["optimizer"]["state"][name][k] = local_part(p, v).clone()
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim["optimizer"])
