"""The checks of ``vlmcp train --model``'s frozen-part and LoRA fields (before any rank starts)."""

from __future__ import annotations

__all__ = ["FINETUNE_FIELDS", "check_finetune"]

PARTS = ("vision", "projector", "llm")
FINETUNE_FIELDS = {"freeze": (), "lora": False, "lora_rank": 8, "lora_alpha": 16.0, "lora_dropout": 0.0,
                   "lora_targets": "all", "lora_vision": None, "lora_projector": None}
"""The fields a resumed run must share with its checkpoint (``merge_lora`` only changes the output),
with their defaults (what a checkpoint from before a field holds)."""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_finetune(cfg) -> None:
    """Validate (and normalise: ``freeze`` a tuple without repeats) the fields of an ``HFTrainConfig``."""
    freeze = cfg.freeze
    if isinstance(freeze, str) or not isinstance(freeze, (list, tuple)):
        raise ValueError(f"--freeze takes parts {PARTS} (repeat the flag), got {freeze!r}")
    for part in freeze:
        if part not in PARTS:
            raise ValueError(f"--freeze {part!r}: the parts are {', '.join(PARTS)}")
    object.__setattr__(cfg, "freeze", tuple(dict.fromkeys(freeze)))
    if not cfg.lora:
        for name, default in FINETUNE_FIELDS.items():
            if name.startswith("lora_") and getattr(cfg, name) != default:
                raise ValueError(f"{_flag(name)} needs --lora")
        if cfg.merge_lora:
            raise ValueError("--merge-lora needs --lora")
        if set(cfg.freeze) == set(PARTS):
            raise ValueError("--freeze vision, projector and llm leaves nothing to train")
        return
    rank = cfg.lora_rank
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"--lora-rank must be an integer >= 1, got {rank!r}")
    if not cfg.lora_alpha > 0:
        raise ValueError(f"--lora-alpha must be > 0, got {cfg.lora_alpha!r}")
    if not 0.0 <= cfg.lora_dropout < 1.0:
        raise ValueError(f"--lora-dropout must be in [0, 1), got {cfg.lora_dropout!r}")
    for name in ("lora_targets", "lora_vision", "lora_projector"):
        value = getattr(cfg, name)
        if value is not None and (not isinstance(value, str) or not value.replace(",", "").strip()):
            raise ValueError(f"{_flag(name)} must be 'all' or comma-separated module names, got {value!r}")
    if "llm" in cfg.freeze and cfg.lora_targets != FINETUNE_FIELDS["lora_targets"]:
        raise ValueError(f"--lora-targets {cfg.lora_targets} puts adapters on the llm, which --freeze llm "
                         "keeps as loaded")
    for part, name in (("vision", "lora_vision"), ("projector", "lora_projector")):
        if part in cfg.freeze and getattr(cfg, name) is not None:
            raise ValueError(f"{_flag(name)} puts adapters on the {part}, which --freeze {part} keeps as "
                             "loaded")
    adapted = [p for p, on in (("llm", "llm" not in cfg.freeze), ("vision", cfg.lora_vision is not None),
                               ("projector", cfg.lora_projector is not None)) if on]
    if not adapted:
        raise ValueError("--lora with --freeze llm and neither --lora-vision nor --lora-projector puts no "
                         "adapter anywhere")
