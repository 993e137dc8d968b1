"""The three parts of a Hugging Face VLM, ``vision``, ``projector`` and ``llm``, and freezing them.

The parts come from the architecture's adapter, never from parameter-name guesses:

* ``projector`` (:meth:`HFAdapter.projector_paths <vlmcp.hf.adapters.HFAdapter.projector_paths>`):
  the module that holds the projector's last layer (``adapter.projector_last``) where the
  adapter lists it as a vision module of its own (LLaVA's ``multi_modal_projector``,
  Idefics3's ``connector``), else the child of the vision module on the path to it (Qwen-VL's
  ``visual.merger``); the deepstack mergers (Qwen3-VL's ``visual.deepstack_merger_list``) and
  the adapter's loose vision parameters (LLaVA-NeXT's ``image_newline``, applied after the
  projector) too;
* ``vision``: every other parameter of the adapter's vision modules (the ViT);
* ``llm``: everything else (the language model, its embeddings and the LM head).

Freezing sets ``requires_grad=False``; call :func:`freeze` before
:func:`vlmcp.hf.parallelize` (which keeps it: ``hidden_shard``'s projector slice and the
vision parameters it re-creates inherit it) and before building the optimizer. A frozen
vision side (ViT and projector) runs without autograd under CP (Note [vlmcp HF vision
placement]), in every vision mode.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from vlmcp.hf.adapters import adapter_for, submodule
from vlmcp.hf.peft import unwrap_peft

__all__ = ["PARTS", "freeze", "part_by_name", "part_names"]

PARTS = ("vision", "projector", "llm")


def part_names(model: nn.Module) -> dict[str, list[str]]:
    """Parameter names of ``model`` (a HF VLM or a ``PeftModel`` around one) by part, in
    ``model.named_parameters()`` order; every parameter is in exactly one part.

    Raises:
        ValueError: the architecture's adapter names no vision module (``vision`` and
            ``projector`` cannot be told apart from the LLM) or no projector layer.
    """
    inner = unwrap_peft(model)
    adapter = adapter_for(inner)
    if not adapter.vision_modules:
        raise ValueError(f"{type(inner).__name__} (vlmcp adapter {adapter.name!r}) names no vision module: "
                         "vlmcp cannot tell its vision tower and projector from its language model")
    owner_of: dict[int, str] = {}
    if adapter.projector_last is not None:
        for path in adapter.projector_paths(inner):
            for p in submodule(inner, path).parameters():
                owner_of[id(p)] = "projector"
    for path in adapter.vision_params:
        owner_of[id(inner.get_parameter(path))] = "projector"
    for path in adapter.vision_module_paths(inner):
        for p in submodule(inner, path).parameters():
            owner_of.setdefault(id(p), "vision")
    out: dict[str, list[str]] = {part: [] for part in PARTS}
    for name, p in model.named_parameters():
        out[owner_of.get(id(p), "llm")].append(name)
    if adapter.projector_last is None and out["projector"] == []:
        out["projector"] = None  # type: ignore[assignment]  # unknown: freeze() refuses it by name
    return out


def part_by_name(model: nn.Module) -> dict[str, str]:
    """``{parameter name: part}`` of :func:`part_names`; empty where the adapter names no vision
    module (a placeholder adapter: the caller decides)."""
    try:
        names = part_names(model)
    except ValueError:
        return {}
    return {n: part for part, ns in names.items() if ns for n in ns}


def freeze(model: nn.Module, parts: Iterable[str]) -> dict[str, int]:
    """Set ``requires_grad=False`` on every parameter of the named parts (in place).

    Args:
        model: a HF VLM with a vlmcp adapter, or a ``PeftModel`` around one (a LoRA
            adapter's own parameters stay trainable: freezing applies to the base weights).
        parts: any of ``"vision"``, ``"projector"``, ``"llm"``.

    Returns:
        How many parameters each named part has (all now frozen).

    Raises:
        ValueError: an unknown part, a part the adapter cannot locate, or nothing left to train.
    """
    parts = list(dict.fromkeys(parts))
    for part in parts:
        if part not in PARTS:
            raise ValueError(f"cannot freeze {part!r}: the parts are {PARTS}")
    if not parts:
        return {}
    names = part_names(model)
    params = dict(model.named_parameters())
    counts = {}
    for part in parts:
        if names[part] is None:
            raise ValueError(f"cannot freeze the projector of {type(unwrap_peft(model)).__name__}: its vlmcp "
                             "adapter names no projector layer")
        counts[part] = 0
        for name in names[part]:
            if "lora_" in name:  # an adapter's weights are what is trained on top of a frozen part
                continue
            params[name].requires_grad_(False)
            counts[part] += 1
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"freezing {', '.join(parts)} leaves no parameter to train")
    return counts
