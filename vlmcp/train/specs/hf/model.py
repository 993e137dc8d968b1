"""A Hugging Face model directory's model for training: loaded, frozen or LoRA'd, parallelized under
CP (:func:`vlmcp.hf.parallelize`), FSDP2-sharded with ``--fsdp``; and its parts for the norms."""

from __future__ import annotations

import torch
from torch import nn

from vlmcp.grads import ddp_ignored_params
from vlmcp.train.options import TORCH_DTYPES
from vlmcp.train.specs.hf.config import HFTrainConfig
from vlmcp.train.specs.hf.finetune import prepare_model, without_input_grad_hooks

__all__ = ["hf_parts", "load_parallel_model", "part_of"]


def fully_shard_blocks(model: nn.Module, world: int, device: torch.device) -> None:
    """FSDP2 over all ranks: each transformer block (``_no_split_modules``), then the root.

    ``hidden_shard``'s projector slice differs per CP rank, so it stays out of FSDP
    (``ddp_ignored_params``); :func:`vlmcp.grads.finish_ddp_gradients` averages it over DP.
    16-bit parameters reduce their gradients in fp32; fp32 and fp64 ones in their own dtype.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world,))
    sixteen = next(model.parameters()).dtype in (torch.bfloat16, torch.float16)
    policy = MixedPrecisionPolicy(reduce_dtype=torch.float32 if sixteen else None)
    names = set(ddp_ignored_params(model))
    ignored = {p for n, p in model.named_parameters() if n in names}
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy, ignored_params=ignored or None)


def load_parallel_model(cfg: HFTrainConfig, cp_group, world: int, device: torch.device) -> nn.Module:
    """The model of ``cfg.model`` in ``cfg.dtype`` on ``device``, parallelized (and FSDP-sharded)."""
    from transformers import AutoModelForImageTextToText
    from transformers.utils import logging as hf_logging

    import vlmcp.hf

    hf_logging.disable_progress_bar()  # one progress bar per run (rank 0's), not one per rank and file
    model = AutoModelForImageTextToText.from_pretrained(cfg.model, dtype=TORCH_DTYPES[cfg.dtype])
    model = prepare_model(cfg, model).to(device)  # --freeze, --lora
    model.train()
    if cfg.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        without_input_grad_hooks(model)
    vlmcp.hf.parallelize(model, cp_group, attention=cfg.attention, vision_mode=cfg.vision_mode)
    if cfg.fsdp:
        fully_shard_blocks(model, world, device)
    return model


def part_of(name: str) -> str:
    """``vision``, ``projector`` or ``llm`` by a parameter's name, where the adapter names no part."""
    if "merger" in name or "multi_modal_projector" in name:
        return "projector"
    if "visual" in name or "vision_tower" in name:
        return "vision"
    return "llm"


def hf_parts(model: nn.Module) -> dict[str, str]:
    """Every parameter's part as the architecture's adapter names them (:func:`vlmcp.hf.freeze.part_by_name`:
    Idefics3's ``vision_model`` and ``connector`` too), by name otherwise (:func:`part_of`)."""
    from vlmcp.hf.freeze import part_by_name

    where = part_by_name(model)
    return {name: where.get(name) or part_of(name) for name, _ in model.named_parameters()}
