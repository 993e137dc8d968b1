"""LoRA on a Hugging Face VLM under CP, with ``peft`` (``pip install 'vlmcp[peft]'``).

:func:`apply_lora` wraps the chosen ``nn.Linear`` layers with peft's LoRA (``get_peft_model``;
every base weight frozen) and returns the ``peft.PeftModel``; :func:`vlmcp.hf.parallelize`,
:func:`vlmcp.hf.shard_inputs` and :func:`vlmcp.hf.causal_lm_loss` take that ``PeftModel``
as they take the model itself (they work on the model inside, :func:`unwrap_peft`, and call
the wrapper's forward, so peft's hooks run). Call :func:`apply_lora` before ``parallelize``.

Exactness under CP needs nothing new: a LoRA layer is two more Linear layers inside the
module it wraps, so its parameters carry the rule of the module they live in (Note
[vlmcp gradient rules]): share in the LLM and in a ViT or projector run by every rank,
full on the ``broadcast`` source, and so on. ``hidden_shard`` slices the projector's last
Linear by output columns; a LoRA around it is sliced with it (:func:`slice_columns`: ``B``
by rows, PARTITIONED; ``A`` whole, SHARE), and what it cannot slice (DoRA and other
variants, a merged adapter) is refused by name at ``parallelize``. LoRA on the LM head is
refused (:func:`vlmcp.hf.causal_lm_loss` computes the head from its weight a chunk at a time).

Targets (:func:`lora_targets`): the language model's ``all`` (every Linear but the LM head),
``attn`` (the Linear layers of its attention modules), ``mlp`` (of its feed-forward and expert
modules) or comma-separated module names (a name matches a module whose path is it or
ends in ``.name``); optionally the vision tower's and the projector's, ``all`` or names,
with the parts as :mod:`vlmcp.hf.freeze` defines them. A name that matches no Linear layer of
its part is an error naming it.
"""

from __future__ import annotations

import re

from torch import nn

from vlmcp.deps import check_versions
from vlmcp.hf.adapters import adapter_for, submodule
from vlmcp.vision.modes import column_slice

__all__ = ["apply_lora", "check_hidden_shard_layers", "is_peft_model", "lora_targets", "slice_columns",
           "unwrap_peft"]

_ATTN = re.compile(r"attention|attn", re.IGNORECASE)
_MLP = re.compile(r"mlp|feedforward|feed_forward|expert", re.IGNORECASE)


def is_peft_model(model: nn.Module) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (checked without importing peft; FSDP2's
    ``fully_shard`` makes its class a subclass defined elsewhere)."""
    return any(c.__name__ == "PeftModel" and c.__module__.startswith("peft.") for c in type(model).__mro__)


def unwrap_peft(model: nn.Module) -> nn.Module:
    """The transformers model inside a ``peft.PeftModel`` (``model`` itself otherwise)."""
    return model.get_base_model() if is_peft_model(model) else model


def _under(name: str, paths) -> bool:
    return any(name == p or name.startswith(p + ".") for p in paths)


def _part_modules(model: nn.Module, part: str) -> dict[str, nn.Linear]:
    """The ``nn.Linear`` layers of one part (``llm``, ``vision``, ``projector``), by full name."""
    adapter = adapter_for(model)
    lm_head = adapter.lm_head
    vision = adapter.vision_module_paths(model)
    projector = adapter.projector_paths(model) if adapter.projector_last is not None else []
    out = {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or name == lm_head:
            continue
        if part == "llm":
            keep = _under(name, [adapter.language_model])
        elif part == "vision":
            keep = _under(name, vision) and not _under(name, projector)
        else:
            keep = _under(name, projector)
        if keep:
            out[name] = module
    return out


def _select(model: nn.Module, part: str, spec: str, flag: str) -> list[str]:
    linear = _part_modules(model, part)
    if spec == "all":
        chosen = list(linear)
    elif spec in ("attn", "mlp") and part == "llm":
        pattern = _ATTN if spec == "attn" else _MLP
        chosen = [n for n in linear
                  if pattern.search(type(model.get_submodule(n.rpartition(".")[0])).__name__)]
    else:
        chosen = []
        leaves = sorted({n.rpartition(".")[2] for n in linear})
        for want in [t.strip() for t in spec.split(",") if t.strip()]:
            if want == adapter_for(model).lm_head or want.endswith("lm_head"):
                raise ValueError(f"{flag} {want}: LoRA on the LM head is not supported "
                                 "(vlmcp.hf.causal_lm_loss computes the head from its weight, a chunk of "
                                 "tokens at a time)")
            hits = [n for n in linear if n == want or n.endswith("." + want)]
            if not hits:
                raise ValueError(f"{flag} {want!r} matches no Linear layer of the {part} of "
                                 f"{type(model).__name__}; its Linear layers are named {', '.join(leaves)}")
            chosen += hits
    if not chosen:
        raise ValueError(f"{flag} {spec}: the {part} of {type(model).__name__} has no such Linear layer")
    return list(dict.fromkeys(chosen))


def lora_targets(model: nn.Module, targets: str | None = "all", *, vision: str | None = None,
                 projector: str | None = None) -> list[str]:
    """Full module names of the Linear layers that get adapters (see the module docstring).

    Args:
        model: a HF VLM with a vlmcp adapter.
        targets: the language model's: ``all``, ``attn``, ``mlp`` or comma-separated names;
            None: none.
        vision: the vision tower's (``all`` or names), or None.
        projector: the projector's (``all`` or names), or None.

    Raises:
        ValueError: a name that matches no Linear layer of its part, the LM head, nothing chosen.
    """
    names: list[str] = []
    for part, spec, flag in (("llm", targets, "--lora-targets"), ("vision", vision, "--lora-vision"),
                             ("projector", projector, "--lora-projector")):
        if spec is not None:
            names += _select(model, part, spec, flag)
    if not names:
        raise ValueError("no LoRA target: name the language model's, the vision tower's or the "
                         "projector's layers")
    return names


def apply_lora(model: nn.Module, *, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0,
               targets: str | None = "all", vision: str | None = None, projector: str | None = None):
    """``peft.get_peft_model`` of ``model`` with LoRA on :func:`lora_targets` (before ``parallelize``).

    Args:
        model: a HF VLM with a vlmcp adapter, not parallelized yet.
        rank, alpha, dropout: ``LoraConfig``'s ``r``, ``lora_alpha``, ``lora_dropout``.
        targets, vision, projector: see :func:`lora_targets`.

    Returns:
        The ``peft.PeftModel`` (only the adapters' parameters require grad; they have the
        dtype of the layers they wrap, so a bf16 model stays one dtype for FSDP2).
    """
    from peft import LoraConfig, get_peft_model

    check_versions("peft")

    if getattr(model, "_vlmcp_hf", None) is not None:
        raise ValueError("apply_lora before vlmcp.hf.parallelize: the model is parallelized already")
    names = lora_targets(model, targets, vision=vision, projector=projector)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=names, bias="none")
    return get_peft_model(model, config, autocast_adapter_dtype=False)  # adapters in the base's dtype


def _lora_linear_why_not(layer: nn.Module) -> str | None:
    """None if ``layer`` is peft's plain LoRA around an ``nn.Linear`` (sliceable), else why not."""
    if not (type(layer).__name__ == "Linear" and type(layer).__module__.startswith("peft.tuners.lora")):
        return f"a {type(layer).__name__}"
    if type(layer.base_layer) is not nn.Linear:
        return f"a LoRA layer around a {type(layer.base_layer).__name__}"
    if getattr(layer, "lora_variant", None) or getattr(layer, "fan_in_fan_out", False):
        return "a LoRA variant (DoRA, ...) or a fan-in-fan-out layer"
    if getattr(layer, "merged", False):
        return "a LoRA layer with its adapter merged in"
    return None


def slice_columns(layer: nn.Module, rank: int, world: int) -> nn.Module:
    """``hidden_shard``: this rank's ``1/world`` of ``layer``'s output columns, PARTITIONED.

    A plain ``nn.Linear`` becomes :func:`vlmcp.vision.modes.column_slice` of it. peft's LoRA
    around one keeps its wrapper: the base layer and every adapter's ``B`` (``r -> out``)
    are sliced by rows (PARTITIONED, full for this rank's columns after the gather's
    reduce-scatter dual), while ``A`` (``in -> r``) stays whole with the ViT's rule (SHARE:
    rank r's ``A`` gradient comes through its own columns only, and the ranks' shares sum to
    the whole). ``y[:, cols_r] = W[cols_r] x + s * B[cols_r] (A x)``: the slice's output is
    exactly the columns of the whole layer's.
    """
    if type(layer) is nn.Linear:
        return column_slice(layer, rank, world)
    layer.base_layer = column_slice(layer.base_layer, rank, world)
    for name in list(layer.lora_B.keys()):
        layer.lora_B[name] = column_slice(layer.lora_B[name], rank, world)
    layer.out_features = layer.base_layer.out_features
    return layer


def check_hidden_shard_layers(model: nn.Module, paths) -> None:
    """``hidden_shard`` slices these layers by output columns: each must be a plain ``nn.Linear``, or
    peft's plain LoRA around one (:func:`slice_columns`)."""
    for path in paths:
        layer = submodule(model, path)
        if type(layer) is nn.Linear:
            continue
        why = _lora_linear_why_not(layer)
        if why is not None:
            raise ValueError(
                f"vision_mode='hidden_shard' slices the projector's last layer {path} by output columns, "
                f"but it is {why}, which vlmcp does not slice (an adapter would be dropped): leave that "
                "layer out of the adapters' targets or use another vision mode")
