"""``vlmcp train --model``'s frozen parts and LoRA: the model before ``parallelize``, and its output.

:func:`prepare_model` runs on every rank right after loading: ``--freeze`` sets
``requires_grad=False`` on the named parts (:mod:`vlmcp.hf.freeze`); ``--lora`` wraps the
chosen Linear layers with peft's LoRA (:mod:`vlmcp.hf.peft`), initialised from ``--seed`` so
every rank starts from the same adapters. The optimizer
(:func:`vlmcp.train.optim.make_optimizer`) then holds the trainable parameters only, so a
frozen weight is never touched and is saved bit-identical to the input. Checkpoints leave
the frozen weights out (:mod:`vlmcp.train.checkpoint.frozen`: their names and a digest, sum and
sum of squares each): ``--resume`` takes them from ``--model`` again, after checking the
digest, so a LoRA run's checkpoint is its adapters and their AdamW state.

The output of a LoRA run (:func:`lora_output`) is a PEFT adapter, ``adapter_config.json`` and
``adapter_model.safetensors`` (keys as peft's ``get_peft_model_state_dict`` writes them, the
adapter name left out), that ``PeftModel.from_pretrained(base, OUT)`` loads; with
``--merge-lora`` the base weights with ``W + (alpha / r) B A`` merged in, as a plain model of
the input's kind. Both are computed on rank 0 from the gathered state (FSDP shards and
``hidden_shard`` slices full size).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

__all__ = ["check_model", "describe_trainable", "lora_output", "prepare_model", "save_adapter",
           "without_input_grad_hooks"]

_PREFIX = "base_model.model."


def prepare_model(cfg, model: nn.Module) -> nn.Module:
    """Freeze ``cfg.freeze`` or put LoRA on the model (before ``parallelize``); returns the model to train."""
    from vlmcp.hf.freeze import freeze

    if not cfg.lora:
        freeze(model, cfg.freeze)
        return model
    from vlmcp.hf.peft import apply_lora

    with torch.random.fork_rng(devices=[]):  # the same adapters on every rank, from --seed
        torch.manual_seed(cfg.seed)
        return apply_lora(model, rank=cfg.lora_rank, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout,
                          targets=None if "llm" in cfg.freeze else cfg.lora_targets,
                          vision=cfg.lora_vision, projector=cfg.lora_projector)


def check_model(cfg) -> None:
    """``--freeze`` and ``--lora`` on ``cfg.model``'s architecture, before any rank starts: the
    parts and the LoRA targets are resolved on a copy built on the meta device (no weights
    read), so a part the adapter cannot locate or a target name that matches nothing is a
    one-line error, and ``--lora`` without peft installed too."""
    if not (cfg.freeze or cfg.lora):
        return
    import importlib.util

    if cfg.lora and importlib.util.find_spec("peft") is None:
        raise ValueError("--lora needs peft: pip install 'vlmcp[peft]'")
    from transformers import AutoConfig, AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(cfg.model))
    prepare_model(cfg, model)


def without_input_grad_hooks(model: nn.Module) -> None:
    """Remove HF's ``enable_input_require_grads`` hooks (``gradient_checkpointing_enable`` adds them):
    non-reentrant checkpointing does not need them, and on the ViT's patch embedding they would
    run a frozen ViT's backward (Note [vlmcp HF vision placement])."""
    from vlmcp.hf.peft import unwrap_peft

    unwrap_peft(model).disable_input_require_grads()


def describe_trainable(cfg, model: nn.Module) -> str | None:
    """One line naming what trains (``--freeze`` or ``--lora`` runs only; None otherwise).

    Counts are of the whole model: a ``hidden_shard`` slice counts at full size, an FSDP
    parameter (a DTensor) at its global size.
    """
    from vlmcp.grads import partition_of

    if not (cfg.freeze or cfg.lora):
        return None
    size = lambda p: p.numel() * (partition_of(p)[2] if partition_of(p) is not None else 1)  # noqa: E731
    params = list(model.parameters())
    total, trained = sum(size(p) for p in params), sum(size(p) for p in params if p.requires_grad)
    what = f"training {trained:,} of {total:,} parameters ({trained / total:.2%})"
    if cfg.lora:
        layers = sum(1 for name, _ in model.named_modules() if name.endswith(".lora_A"))
        what += f": LoRA r={cfg.lora_rank}, alpha={cfg.lora_alpha:g} on {layers} layers"
        if cfg.freeze:
            what += f", none on the frozen {', '.join(cfg.freeze)}"
    else:
        what += f"; frozen: {', '.join(cfg.freeze)}"
    return f"vlmcp train: {what}"


def _module_of(key: str, kind: str) -> str:
    return key[len(_PREFIX):key.index(f".{kind}.")]


def lora_output(cfg, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict | None]:
    """Split a LoRA run's gathered state (the ``PeftModel``'s names) into the model to save.

    Returns:
        ``(base, adapter)``: ``base`` in the input model's names (with ``--merge-lora`` the
        adapters merged in; else the loaded weights, untouched), and ``adapter`` (None with
        ``--merge-lora``): ``{"weights": ..., "targets": [module names]}`` in peft's format.
    """
    base, lora = {}, {}
    for key, value in state.items():
        if not key.startswith(_PREFIX):
            raise RuntimeError(f"a LoRA run's state holds {key!r}, which is not inside the PeftModel's model")
        if ".lora_" in key:
            lora[key] = value
        else:
            base[key[len(_PREFIX):].replace(".base_layer.", ".")] = value
    targets = sorted({_module_of(k, "lora_A") for k in lora if ".lora_A." in k})
    if not cfg.merge_lora:
        weights = {k.replace(".default.", "."): v.contiguous() for k, v in lora.items()}
        return base, {"weights": weights, "targets": targets}
    scale = cfg.lora_alpha / cfg.lora_rank
    for module in targets:
        a = lora[f"{_PREFIX}{module}.lora_A.default.weight"]
        b = lora[f"{_PREFIX}{module}.lora_B.default.weight"]
        w = base[f"{module}.weight"]
        acc = torch.float64 if w.dtype == torch.float64 else torch.float32
        base[f"{module}.weight"] = (w.to(acc) + scale * (b.to(acc) @ a.to(acc))).to(w.dtype)
    return base, None


def save_adapter(cfg, adapter: dict, directory: Path) -> None:
    """Write ``adapter_config.json`` and ``adapter_model.safetensors`` into ``directory``."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    config = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                        target_modules=adapter["targets"], bias="none")
    config.base_model_name_or_path = str(cfg.model)
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(directory))
    save_file({k: v.detach().cpu() for k, v in adapter["weights"].items()},
              str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
