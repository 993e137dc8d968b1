"""The trained model of ``vlmcp train --model``: ``save_pretrained``, written like a checkpoint.

The final model is a checkpoint too. ``save_pretrained`` (weights, config, processor)
writes into a temporary directory inside ``--output-dir``, its files are renamed into
place, and ``vlmcp_model.json`` (the step and every file's size) is written last::

    OUT/.model.tmp-<pid>-<host>/   <- save_pretrained, save_processor      (crash: ignored)
    OUT/vlmcp_model.json            removed                                 (from here: incomplete)
    OUT/model.safetensors, ...      <- os.replace, one file at a time
    OUT/vlmcp_model.json            <- {"step": N, "files": {name: size}}   (complete)

so a run that died while saving (a full disk, a kill) leaves a model that
:func:`final_model_complete` calls incomplete, and ``--resume`` of a run whose last
checkpoint is at ``--steps`` writes it again from that checkpoint. The files are fsynced
before they are renamed, the directory after; the temporary directory and the marker's
temporary file are created exclusively (a link planted at their predictable names is never
written through). A full disk is one ``OSError`` line naming ``--output-dir``, also where
safetensors' writer (Rust) reports it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.grads import partition_of
from vlmcp.train.checkpoint.dcp import gather_slice, partitioned_params
from vlmcp.train.checkpoint.durable import (
    clean_os_error,
    fsync_dir,
    fsync_file,
    open_exclusive,
    remove_stale_temps,
)
from vlmcp.train.lock import writer_tag
from vlmcp.train.specs.hf.finetune import lora_output, save_adapter

__all__ = ["MODEL_MARKER", "final_model_complete", "save_trained_model"]

MODEL_MARKER = "vlmcp_model.json"
_MODEL_TEMP = re.compile(r"^\.model\.tmp-(\d+)-(.*)$")


def _gathered_state(model: nn.Module, cp_group: dist.ProcessGroup, fsdp: bool) -> dict[str, torch.Tensor]:
    """Full-size parameters and buffers by name on rank 0 (a collective)."""
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        for name, p in partitioned_params(model).items():  # outside FSDP: still this rank's slice
            full = gather_slice(p, p.detach(), cp_group).cpu()
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


def final_model_complete(output_dir: str | os.PathLike, step: int) -> bool:
    """Whether ``output_dir`` holds the whole final model of ``step`` (its marker lists every
    file and its size; a save that died part way has no marker or misses a file)."""
    out = Path(output_dir)
    try:
        marker = json.loads((out / MODEL_MARKER).read_text())
        files = marker["files"]
        return marker["step"] == step and bool(files) and all(
            (out / name).is_file() and (out / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _publish(temp: Path, out: Path, step: int) -> None:
    """Move the files of ``temp`` into ``out`` and write the marker last (see the module docstring)."""
    for p in sorted(temp.iterdir()):  # on disk before any name says so
        if p.is_file() and not p.is_symlink():
            fsync_file(p)
    (out / MODEL_MARKER).unlink(missing_ok=True)  # from here until the end: incomplete
    files = {}
    for p in sorted(temp.iterdir()):
        if p.is_dir():
            shutil.rmtree(out / p.name, ignore_errors=True)
        os.replace(p, out / p.name)
        if p.is_file() or (out / p.name).is_file():
            files[p.name] = (out / p.name).stat().st_size
    fsync_dir(out)
    marker = out / f".{MODEL_MARKER}.tmp-{writer_tag()}"
    with open_exclusive(marker) as f:
        f.write(json.dumps({"step": step, "files": files}, indent=1).encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(marker, out / MODEL_MARKER)
    fsync_dir(out)
    temp.rmdir()


def _clean_model(cfg, state: dict[str, torch.Tensor]) -> nn.Module:
    """A fresh model of ``cfg.model``'s config holding ``state`` (built on meta, the tensors assigned)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(cfg.model)
    with torch.device("meta"):
        clean = AutoModelForImageTextToText.from_config(config, dtype=next(iter(state.values())).dtype)
    missing = sorted(set(clean.state_dict()) - set(state))
    if missing:
        raise RuntimeError(f"the trained model lacks {missing[:5]}; cannot save it as {cfg.model}'s kind")
    clean.load_state_dict({k: state[k] for k in clean.state_dict()}, assign=True)
    return clean


def save_trained_model(cfg, model: nn.Module, processor, world: dist.ProcessGroup,
                       cp_group: dist.ProcessGroup, step: int | None = None) -> Path:
    """``save_pretrained`` of the trained weights and the processor into ``cfg.output_dir``.

    The weights go into a fresh, unparallelized model of the directory's own config (no
    vlmcp attention or vision placement is saved), so any transformers consumer loads it;
    a LoRA run writes its PEFT adapter instead, or with ``--merge-lora`` the merged weights
    (:mod:`vlmcp.train.specs.hf.finetune`).
    Written through a temporary directory and renamed into place, marker last (see the
    module docstring); ``step`` (default ``cfg.steps``) goes into the marker.

    Raises:
        OSError: one line naming the directory and the reason (e.g. a full disk).
    """
    from vlmcp.data.hf.processor import save_processor

    state = _gathered_state(model, cp_group, cfg.fsdp)
    out = Path(cfg.output_dir)
    if dist.get_rank(world) == 0:
        adapter = None
        if getattr(cfg, "lora", False):  # a PEFT adapter, or with --merge-lora the merged weights
            state, adapter = lora_output(cfg, state)
        clean = _clean_model(cfg, state) if adapter is None else None
        out.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(out, _MODEL_TEMP)
        temp = out / f".model.tmp-{writer_tag()}"
        try:
            temp.mkdir()  # ours alone: save_pretrained would write through a link planted at the name
            if adapter is None:
                clean.save_pretrained(temp)
            else:
                save_adapter(cfg, adapter, temp)
            save_processor(processor, temp)
            _publish(temp, out, cfg.steps if step is None else step)
        except Exception as err:
            if temp.is_dir() and not temp.is_symlink():
                shutil.rmtree(temp, ignore_errors=True)
            failure = clean_os_error(err, f"the trained model to {out}")
            if failure is not None:
                raise failure from None
            raise
    dist.barrier(group=world)
    return out
