"""Checkpoints of ``vlmcp train --model``.

Two kinds, by ``--fsdp``:

* without FSDP every rank holds the whole model: the atomic, checksummed single file of
  :mod:`vlmcp.train.checkpoint` (Note [vlmcp checkpoints: atomic write, newest good file
  wins]) with the layout-free state of :mod:`vlmcp.train.state`, so it resumes at another
  CP size;
* with FSDP each rank holds a shard: ``torch.distributed.checkpoint`` writes every rank's
  shard into ``.step_N.tmp-<pid>-<host>/`` (on a directory all ranks share; rank 0 names it),
  rank 0 adds ``vlmcp_meta.pt`` (step, data position, config, the SHA-256 of every file
  and of the meta itself) and renames it to ``step_N/`` only after every rank finished, so a
  crash never leaves a partial ``step_N`` (Note [vlmcp DCP checkpoints: atomic and durable]).
  DCP stores tensors by name with their global shapes, so a run resumes at another CP or DP
  size.

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
import hashlib
import os
import re
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.grads import local_part, partition_of
from vlmcp.train.checkpoint import (
    checkpoint_path,
    clean_os_error,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
    payload_digest,
    remove_stale_temps,
    save_checkpoint,
)
from vlmcp.train.durable import open_exclusive, publish_dir, retire_dir
from vlmcp.train.hf.finetune import check_frozen, frozen_record
from vlmcp.train.hf.finetune_config import finetune_changes
from vlmcp.train.lock import writer_tag
from vlmcp.train.state import full_state, load_full_state

__all__ = ["check_resumable", "checkpoint_count", "latest_step", "load_hf_checkpoint", "save_hf_checkpoint"]

_DIR = re.compile(r"^step_(\d{8,})$")
_TEMP = re.compile(r"^\.step_\d{8,}\.(?:tmp|old)-(\d+)-(.*)$")  # being written, or being deleted
_META = "vlmcp_meta.pt"
_RESUME_FIELDS = ("model", "data", "seq_len", "seed", "dtype", "image_root", "video",
                  # what the rows are made of (a checkpoint from before these fields holds their defaults)
                  "dataset", "dataset_dir", "max_samples", "image_max_pixels", "image_min_pixels", "truncate")
_SCHEDULE_FIELDS = ("steps", "grad_accum", "lr", "lr_scheduler", "warmup_steps", "warmup_ratio",
                    "weight_decay")  # the optimizer state keeps its weight decay
"""Checked where the checkpoint has them (older checkpoints: ``steps`` only)."""
_PATH_FIELDS = ("model", "data", "image_root", "dataset_dir")


def _dcp_dirs(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir()
             if (m := _DIR.match(p.name)) and (p / _META).is_file()]
    return sorted(found)


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _dcp_meta(path: Path) -> dict:
    """The meta of the DCP checkpoint ``path`` after checking every checksum it carries.

    Raises:
        UnsafeCheckpoint: a file would unpickle something a checkpoint never holds (see
            :func:`vlmcp.train.hf.dcp_reader.check_dcp_checkpoint`).
        ValueError: naming the file that cannot be read or does not match.
    """
    try:
        meta = torch.load(path / _META, weights_only=True)
        body = {k: v for k, v in meta.items() if k != "sha256"}
        step, config = int(meta["step"]), meta["config"]
    except Exception as err:
        raise ValueError(f"cannot read {path / _META}: {type(err).__name__}: {err}") from err
    if "sha256" in meta and meta["sha256"] != payload_digest(body):
        raise ValueError(f"{path / _META} is damaged: its contents do not match its checksum")
    for name, digest in meta.get("files", {}).items():
        file = path / name
        if not file.is_file() or _file_sha256(file) != digest:
            raise ValueError(f"{file} is {'damaged' if file.is_file() else 'missing'}: "
                             "the checkpoint's checksum does not match")
    from vlmcp.train.hf.dcp_reader import check_dcp_checkpoint  # imports torch's DCP: only here

    check_dcp_checkpoint(path)  # the checksums tell damage, not tampering: their writer can recompute them
    return {**body, "step": step, "config": config}


def checkpoint_count(directory: str | os.PathLike, fsdp: bool) -> int:
    """How many checkpoints of the kind ``fsdp`` writes ``directory`` holds, good or not."""
    return len(_dcp_dirs(Path(directory))) if fsdp else len(list_checkpoints(directory))


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

    for step, path in reversed(_dcp_dirs(directory)):
        try:
            return step, _dcp_meta(path)["config"]
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
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = Path(directory) / f"step_{step:08d}"
    name = [f".step_{step:08d}.tmp-{writer_tag()}"]  # rank 0's name, for every rank
    dist.broadcast_object_list(name, src=dist.get_global_rank(world, 0), group=world)
    temp = Path(directory) / name[0]
    if rank == 0:
        remove_stale_temps(Path(directory), _TEMP)  # crashed earlier saves of this run or dead ones
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
        meta["files"] = {p.name: _file_sha256(p) for p in sorted(temp.iterdir()) if p.is_file()}
        meta["sha256"] = payload_digest(meta)
        publish_dcp(temp, final, meta, cfg.save_total_limit)
    dist.barrier(group=world)
    return final


def publish_dcp(temp: Path, final: Path, meta: dict, keep: int | None) -> None:
    """Rank 0's part of a DCP save: ``vlmcp_meta.pt`` into the complete ``temp``, ``temp`` to ``final``,
    and the checkpoints beyond the newest ``keep`` (None, 0: all kept) deleted, in the order of
    Note [vlmcp DCP checkpoints: atomic and durable]."""
    with open_exclusive(temp / _META) as f:
        torch.save(meta, f)
        f.flush()
        os.fsync(f.fileno())
    publish_dir(temp, final)
    for _, old in (_dcp_dirs(final.parent)[:-keep] if keep else []):
        retire_dir(old)


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
    there = checkpoint_path(directory, step) if not cfg.fsdp else directory / f"step_{step:08d}" / _META
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
    meta = torch.load(directory / f"step_{step:08d}" / _META, weights_only=True)  # rank 0 checked it
    check_resumable(meta["config"], cfg, step, directory)
    frozen = set(check_frozen(meta["frozen"], model, world, directory)) if "frozen" in meta else set()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from vlmcp.train.hf.dcp_reader import SafeLoadPlanner, SafeReader

    path = directory / f"step_{step:08d}"
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
    return int(meta["step"]), int(meta["data_position"])
