"""What the command line checks of a model directory before any rank starts (``train --model``,
``verify --model DIR``): its config, that vlmcp has an adapter for its architecture, and that the
CP flags fit it. Each problem is one line (exit 2), never a traceback from a spawned rank.
"""

from __future__ import annotations

from pathlib import Path

from vlmcp.deps import check_versions

__all__ = ["check_model_config", "check_model_dir"]


def check_model_dir(model: str, *, cp: int, attention: str, vision_mode: str | None = None):
    """Read ``model``'s config and check it (:func:`check_model_config`); returns the config."""
    if not (Path(model) / "config.json").is_file():
        raise ValueError(f"--model {model}: not a model directory (no config.json)")
    from transformers import AutoConfig

    check_versions("transformers")
    try:
        config = AutoConfig.from_pretrained(model, local_files_only=True)
    except (ValueError, KeyError, OSError) as err:  # a model_type this transformers does not know
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"--model {model}: transformers cannot read its config.json: {first}") from None
    check_model_config(config, model, cp=cp, attention=attention, vision_mode=vision_mode)
    return config


def check_model_config(config, model: str, *, cp: int, attention: str,
                       vision_mode: str | None = None) -> None:
    """Refuse, in one line, an architecture without a vlmcp adapter, a vision mode its adapter does not
    take, Ulysses with attention heads that ``cp`` does not divide, ``hidden_shard`` with a hidden size
    it does not divide, and attention dropout (what :func:`vlmcp.hf.parallelize` would refuse on
    every rank after the spawn)."""
    import types

    from vlmcp.hf.adapters import adapter_for, supported_model_types

    model_type = getattr(config, "model_type", None)
    supported = supported_model_types()
    if model_type not in supported:
        arch = ", ".join(getattr(config, "architectures", None) or ()) or "?"
        raise ValueError(f"--model {model}: unsupported architecture {arch} (model_type={model_type!r}); "
                         f"vlmcp supports model_type {', '.join(supported)}")
    adapter = adapter_for(types.SimpleNamespace(config=config, model=None))
    if vision_mode is not None and vision_mode not in adapter.vision_modes:
        raise ValueError(f"--vision-mode {vision_mode}: {model} (model_type={model_type!r}) takes "
                         f"{', '.join(adapter.vision_modes)}")
    text = getattr(config, "text_config", config)
    heads = getattr(text, "num_attention_heads", None)
    if attention == "ulysses" and heads and heads % cp:
        raise ValueError(f"--attention ulysses splits the model's {heads} attention heads over --cp {cp}, "
                         f"which does not divide them; use --attention ring, or a --cp that divides {heads}")
    hidden = getattr(text, "hidden_size", None)  # the projector's output width: the LM's embeddings
    if vision_mode == "hidden_shard" and cp > 1 and hidden and hidden % cp:
        raise ValueError(f"--vision-mode hidden_shard splits the projector's {hidden} output columns (the "
                         f"language model's hidden size) over --cp {cp}, which does not divide them")
    if getattr(text, "attention_dropout", 0.0):
        raise ValueError(f"--model {model}: its text_config.attention_dropout is {text.attention_dropout}; "
                         "vlmcp attention has no dropout (set it to 0 in config.json)")
