"""``vlmcp train --model``'s flags for frozen parts and LoRA (:func:`add_lora_arguments`)."""

from __future__ import annotations

import argparse

__all__ = ["LORA_DEFAULTS", "add_lora_arguments"]

LORA_DEFAULTS = {"freeze": None, "lora": False, "lora_rank": 8, "lora_alpha": 16.0, "lora_dropout": 0.0,
                 "lora_targets": "all", "lora_vision": None, "lora_projector": None, "merge_lora": False}


def add_lora_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``--freeze``, ``--lora``, the ``--lora-*`` flags and ``--merge-lora``, in a group of their own."""
    g = p.add_argument_group(
        "frozen parts and LoRA (with --model)",
        "A model's parts are its vision tower (vision), its projector (projector) and its language model "
        "with the embeddings and the LM head (llm), as the architecture's vlmcp adapter names them. A frozen "
        "part's weights are saved bit-identical; a frozen vision tower and projector run no backward. With "
        "--lora only the adapters train (every base weight is frozen) and --output-dir receives a PEFT "
        "adapter (adapter_config.json, adapter_model.safetensors; needs the peft extra); --freeze PART then "
        "means no adapter on that part.")
    g.add_argument("--freeze", action="append", choices=("vision", "projector", "llm"), default=None,
                   metavar="{vision,projector,llm}",
                   help="keep this part's weights as loaded; repeat for several (none: train everything)")
    g.add_argument("--lora", action="store_true",
                   help="train LoRA adapters (peft) instead of the weights")
    g.add_argument("--lora-rank", type=int, default=8, metavar="R", help="LoRA rank r")
    g.add_argument("--lora-alpha", type=float, default=16.0, metavar="A",
                   help="LoRA alpha: the update is scaled by alpha / r")
    g.add_argument("--lora-dropout", type=float, default=0.0, metavar="P",
                   help="dropout on the LoRA branch's input (0 keeps training exact under CP and "
                        "reproducible)")
    g.add_argument("--lora-targets", default="all", metavar="all|attn|mlp|NAMES",
                   help="the language model's layers that get adapters: all (every Linear but the LM "
                        "head), attn (the attention projections), mlp (the feed-forward ones) or "
                        "comma-separated module names (q_proj,v_proj)")
    g.add_argument("--lora-vision", nargs="?", const="all", default=None, metavar="all|NAMES",
                   help="also adapters in the vision tower: all its Linear layers (the flag alone) or "
                        "comma-separated module names (none: no adapter there)")
    g.add_argument("--lora-projector", nargs="?", const="all", default=None, metavar="all|NAMES",
                   help="also adapters in the projector: all its Linear layers (the flag alone) or "
                        "comma-separated module names (none: no adapter there)")
    g.add_argument("--merge-lora", action="store_true",
                   help="save the base weights with the adapters merged in (a plain model) instead of the "
                        "PEFT adapter")
