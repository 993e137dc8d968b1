"""Checkpoints of ``vlmcp train --model``, and the final ``save_pretrained`` directory.

Two kinds, by ``--fsdp``:

* without FSDP every rank holds the whole model: the atomic single file of
  :mod:`vlmcp.train.reference.checkpoint` (Note [vlmcp checkpoints: atomic write, newest good file
  wins]) with the layout-free state of :mod:`vlmcp.train.reference.state`, so it resumes at another
  CP size;
* with FSDP each rank holds a shard: ``torch.distributed.checkpoint`` writes every rank's
  shard into ``.step_N.tmp/`` (on a directory all ranks share), rank 0 adds
  ``vlmcp_meta.pt`` (step, data position, config) and renames it to ``step_N/`` only after
  every rank finished, so a crash never leaves a partial ``step_N``. DCP stores tensors by
  name with their global shapes, so a run resumes at another CP or DP size.

Both keep the newest three and carry the data position (rows consumed) for an exact resume.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.grads import local_part, partition_of
from vlmcp.train.reference.checkpoint import load_latest_checkpoint, save_checkpoint
from vlmcp.train.reference.state import full_state, load_full_state

__all__ = ["latest_step", "load_hf_checkpoint", "save_hf_checkpoint", "save_trained_model"]

_DIR = re.compile(r"^step_(\d{8,})$")
_META = "vlmcp_meta.pt"
KEEP_LAST = 3
_RESUME_FIELDS = ("model", "data", "seq_len", "seed", "dtype", "image_root")


def _dcp_dirs(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir()
             if (m := _DIR.match(p.name)) and (p / _META).is_file()]
    return sorted(found)


def latest_step(directory: str | os.PathLike, fsdp: bool) -> tuple[int, dict] | None:
    """``(step, saved config)`` of the newest checkpoint of the kind ``fsdp`` writes, or None."""
    directory = Path(directory)
    if fsdp:
        found = _dcp_dirs(directory)
        if not found:
            return None
        meta = torch.load(found[-1][1] / _META, weights_only=True)
        return found[-1][0], meta["config"]
    ckpt = load_latest_checkpoint(directory)
    return None if ckpt is None else (ckpt.step, ckpt.state["config"])


def check_resumable(saved: dict, cfg, step: int, where: Path) -> None:
    """Raise if a checkpoint of ``saved`` config cannot continue the run ``cfg``."""
    changed = [f"--{f.replace('_', '-')} {saved.get(f)!r} -> {getattr(cfg, f)!r}"
               for f in _RESUME_FIELDS if saved.get(f) != getattr(cfg, f)]
    if saved.get("fsdp") != cfg.fsdp:
        changed.append(f"--fsdp {saved.get('fsdp')} -> {cfg.fsdp}")
    if changed:
        raise ValueError(f"cannot resume from {where}: it belongs to another run ({', '.join(changed)})")
    if step > cfg.steps:
        raise ValueError(f"cannot resume from {where}: its step {step} is past --steps {cfg.steps}")


def _partitioned(model: nn.Module) -> dict[str, nn.Parameter]:
    """``hidden_shard``'s slices by name: kept out of FSDP, different on every CP rank."""
    return {n: p for n, p in model.named_parameters() if partition_of(p) is not None}


def _gather(param: nn.Parameter, t: torch.Tensor, cp_group: dist.ProcessGroup) -> torch.Tensor:
    dim, _, size = partition_of(param)
    pieces = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(pieces, t.detach().contiguous(), group=cp_group)
    return torch.cat(pieces, dim=dim)


def _full_slices(model, model_state: dict, optim_state: dict, cp_group) -> tuple[dict, dict]:
    """Copies of FSDP state dicts with the slices full size (DCP keeps one copy of a plain
    tensor, so every CP rank must hold the same one); a collective over the CP group. The
    inner dicts of ``get_state_dict`` are the optimizer's own: never written to."""
    model_state, states = dict(model_state), dict(optim_state["state"])
    for name, p in _partitioned(model).items():
        model_state[name] = _gather(p, model_state[name], cp_group)
        states[name] = {k: _gather(p, v, cp_group) if torch.is_tensor(v) and v.dim() > 0 else v
                        for k, v in states.get(name, {}).items()}
    return model_state, {**optim_state, "state": states}


def save_hf_checkpoint(cfg, model: nn.Module, optimizer, step: int, position: int,
                       world: dist.ProcessGroup, cp_group: dist.ProcessGroup) -> Path:
    """Write the checkpoint of ``step`` (a collective: every rank calls it)."""
    directory = cfg.checkpoints
    meta = {"step": step, "data_position": position, "config": cfg.to_dict()}
    rank = dist.get_rank(world)
    if not cfg.fsdp:
        state = full_state(model, optimizer, cp_group)
        path = Path(directory) / f"step_{step:08d}.pt"
        if rank == 0:
            state.update(meta)
            save_checkpoint(directory, step, state, keep_last=KEEP_LAST)
        dist.barrier(group=world)
        return path
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = Path(directory) / f"step_{step:08d}"
    temp = Path(directory) / f".step_{step:08d}.tmp"
    if rank == 0:
        shutil.rmtree(temp, ignore_errors=True)  # a crashed earlier save of this step
        temp.mkdir(parents=True)
    dist.barrier(group=world)
    model_state, optim_state = get_state_dict(model, optimizer)
    model_state, optim_state = _full_slices(model, model_state, optim_state, cp_group)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=temp, process_group=world)
    dist.barrier(group=world)
    if rank == 0:
        torch.save(meta, temp / _META)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(temp, final)
        for _, old in _dcp_dirs(Path(directory))[:-KEEP_LAST]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier(group=world)
    return final


def load_hf_checkpoint(cfg, model: nn.Module, optimizer, world: dist.ProcessGroup,
                       device: torch.device) -> tuple[int, int]:
    """Load the newest checkpoint on every rank; returns ``(step, data position)``, ``(0, 0)`` if none.

    Ranks must agree on the step (a directory that is not shared would let them
    continue from different states and wait forever for each other).
    """
    directory = cfg.checkpoints
    found = latest_step(directory, cfg.fsdp)
    step = torch.tensor([-1 if found is None else found[0]], dtype=torch.float64, device=device)
    lo, hi = step.clone(), step.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=world)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=world)
    if lo != hi:
        raise RuntimeError(f"ranks found different latest checkpoints in {directory} (steps {int(lo)} to "
                           f"{int(hi)}); is the directory shared by every rank?")
    if found is None:
        return 0, 0
    check_resumable(found[1], cfg, found[0], Path(directory))
    if not cfg.fsdp:
        ckpt = load_latest_checkpoint(directory)
        load_full_state(model, optimizer, ckpt.state)
        return ckpt.step, int(ckpt.state["data_position"])
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(directory) / f"step_{found[0]:08d}"
    model_state, optim_state = get_state_dict(model, optimizer)
    slices = _partitioned(model)
    full_shape = lambda p, t: [t.shape[d] * partition_of(p)[2] if d == partition_of(p)[0] else t.shape[d]
                               for d in range(t.dim())]
    optim_state = {**optim_state, "state": dict(optim_state["state"])}
    for name, p in slices.items():  # the checkpoint holds them full size (see _full_slices)
        model_state[name] = model_state[name].new_empty(full_shape(p, model_state[name]))
        optim_state["state"][name] = {
            k: v.new_empty(full_shape(p, v)) if torch.is_tensor(v) and v.dim() > 0 else v
            for k, v in optim_state["state"].get(name, {}).items()}
    dcp.load({"model": model_state}, checkpoint_id=path, process_group=world)
    # a parameter that never had a gradient (a ViT layer the model does not use) has no
    # AdamW state in the checkpoint; the fresh state get_state_dict made for it stays
    optim = {"optimizer": optim_state}
    partial = DefaultLoadPlanner(allow_partial_load=True)
    dcp.load(optim, checkpoint_id=path, process_group=world, planner=partial)
    for name, p in slices.items():  # this rank's slice, at this run's CP size
        model_state[name] = local_part(p, model_state[name]).clone()
        for k, v in optim["optimizer"]["state"].get(name, {}).items():
            if torch.is_tensor(v) and v.dim() > 0:
                optim["optimizer"]["state"][name][k] = local_part(p, v).clone()
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim["optimizer"])
    meta = torch.load(path / _META, weights_only=True)
    return int(meta["step"]), int(meta["data_position"])


def _gathered_state(model: nn.Module, cp_group: dist.ProcessGroup, fsdp: bool) -> dict[str, torch.Tensor]:
    """Full-size parameters and buffers by name on rank 0 (a collective)."""
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        for name, p in _partitioned(model).items():  # outside FSDP: still this rank's slice
            full = _gather(p, p.detach(), cp_group).cpu()
            if name in state:
                state[name] = full
        return state
    out = {}
    for name, p in model.named_parameters():
        part = partition_of(p)
        if part is None:
            out[name] = p.detach().cpu()
            continue
        dim, _, size = part
        pieces = [torch.empty_like(p) for _ in range(size)]
        dist.all_gather(pieces, p.detach().contiguous(), group=cp_group)
        out[name] = torch.cat(pieces, dim=dim).cpu()
    for name, b in model.named_buffers():
        out[name] = b.detach().cpu()
    return out


def save_trained_model(cfg, model: nn.Module, processor, world: dist.ProcessGroup,
                       cp_group: dist.ProcessGroup) -> Path:
    """``save_pretrained`` of the trained weights and the processor into ``cfg.output_dir``.

    The weights go into a fresh, unparallelized model of the directory's own config (no
    vlmcp attention or vision placement is saved), so any transformers consumer loads it.
    """
    from transformers import AutoConfig, AutoModelForImageTextToText

    from vlmcp.data.hf.processor import save_processor

    state = _gathered_state(model, cp_group, cfg.fsdp)
    out = Path(cfg.output_dir)
    if dist.get_rank(world) == 0:
        config = AutoConfig.from_pretrained(cfg.model)
        with torch.device("meta"):
            clean = AutoModelForImageTextToText.from_config(config, dtype=next(iter(state.values())).dtype)
        missing = sorted(set(clean.state_dict()) - set(state))
        if missing:
            raise RuntimeError(f"the trained model lacks {missing[:5]}; cannot save it as {cfg.model}'s kind")
        clean.load_state_dict({k: state[k] for k in clean.state_dict()}, assign=True)
        clean.save_pretrained(out)
        save_processor(processor, out)
    dist.barrier(group=world)
    return out
