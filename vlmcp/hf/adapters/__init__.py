"""Per-architecture adapters: what vlmcp needs to know about each Hugging Face VLM.

:func:`adapter_for` finds the adapter of a model by ``config.model_type``;
:func:`register_adapter` adds one for a new architecture (see docs/hf-models.md, "Adding an HF VLM").
"""

from __future__ import annotations

from vlmcp.hf.adapters.base import HFAdapter, InputKind, PlaceholderAdapter, submodule
from vlmcp.hf.adapters.gemma3 import GEMMA3
from vlmcp.hf.adapters.gemma4 import GEMMA4
from vlmcp.hf.adapters.generic import mrope_adapter
from vlmcp.hf.adapters.glm4v import GLM4V
from vlmcp.hf.adapters.glm4v_moe import GLM4V_MOE, GLM46V
from vlmcp.hf.adapters.idefics3 import IDEFICS3, SMOLVLM
from vlmcp.hf.adapters.internvl import INTERNVL
from vlmcp.hf.adapters.kimi_k25 import KIMI_K25
from vlmcp.hf.adapters.lfm2_vl import LFM2_VL
from vlmcp.hf.adapters.llama4 import LLAMA4
from vlmcp.hf.adapters.llava import LLAVA
from vlmcp.hf.adapters.llava_next import LLAVA_NEXT, LLAVA_ONEVISION
from vlmcp.hf.adapters.minimax_m3_vl import MINIMAX_M3_VL
from vlmcp.hf.adapters.mistral3 import MISTRAL3
from vlmcp.hf.adapters.nemotron_h_omni import NEMOTRON_H_OMNI
from vlmcp.hf.adapters.qwen2_vl import QWEN2_5_VL, QWEN2_VL
from vlmcp.hf.adapters.qwen3_5 import QWEN3_5, QWEN3_5_MOE
from vlmcp.hf.adapters.qwen3_vl import QWEN3_VL
from vlmcp.hf.adapters.refused import REFUSED, refusal

__all__ = ["REFUSED", "HFAdapter", "InputKind", "PlaceholderAdapter", "adapter_for", "register_adapter",
           "submodule", "supported_model_types"]

_ADAPTERS: dict[str, HFAdapter] = {}


def register_adapter(adapter: HFAdapter) -> None:
    """Serve ``adapter.model_types`` with ``adapter`` (replacing an earlier one)."""
    if not isinstance(adapter, HFAdapter):
        raise TypeError(f"register_adapter expects an HFAdapter, got {type(adapter).__name__}")
    for t in adapter.model_types:
        _ADAPTERS[t] = adapter


for _a in (QWEN2_VL, QWEN2_5_VL, QWEN3_VL, QWEN3_5, QWEN3_5_MOE, GLM4V, LLAVA, INTERNVL, LLAVA_NEXT,
           LLAVA_ONEVISION, SMOLVLM, IDEFICS3, MISTRAL3, GEMMA3, LFM2_VL, KIMI_K25):
    register_adapter(_a)
register_adapter(NEMOTRON_H_OMNI)
for _a in (GLM4V_MOE, GLM46V, MINIMAX_M3_VL, LLAMA4, GEMMA4):
    register_adapter(_a)


def supported_model_types() -> tuple[str, ...]:
    """``config.model_type`` values with an adapter."""
    return tuple(sorted(_ADAPTERS))


def adapter_for(model) -> HFAdapter:
    """The adapter of ``model``: registered by ``config.model_type``, else the placeholder default.

    Raises:
        ValueError: its model type is refused by name (:data:`REFUSED`, the reason in the message), or
            the model is not a placeholder-merge VLM (no ``text_config``, no image
            token id or no ``get_image_features``), or it has no adapter and computes
            multimodal (M-RoPE) positions without a ``get_rope_index`` vlmcp can call
            (:mod:`vlmcp.hf.adapters.generic` takes those that have one); the message lists
            the supported types.
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type in _ADAPTERS:
        return _ADAPTERS[model_type]
    refused = refusal(model)
    if refused is not None:
        raise ValueError(refused)
    base = getattr(model, "model", None)
    ok = (config is not None and getattr(config, "text_config", None) is not None
          and (getattr(config, "image_token_id", None) is not None
               or getattr(config, "image_token_index", None) is not None)
          and hasattr(base, "get_image_features") and hasattr(base, "language_model"))
    if not ok:
        raise ValueError(
            f"unsupported architecture {type(model).__name__} (model_type={model_type!r}): vlmcp.hf supports "
            f"{', '.join(supported_model_types())}, and any VLM that merges image features at placeholder "
            "tokens (config.image_token_id, model.model.get_image_features, model.model.language_model) "
            "in vision_mode='replicate'; register an adapter for the others (vlmcp.hf.register_adapter)")
    if hasattr(base, "get_rope_index"):  # M-RoPE through its own rope index (the long tail)
        return mrope_adapter(model)
    if _has_mrope(config.text_config):
        raise ValueError(
            f"{type(model).__name__} (model_type={model_type!r}) has no vlmcp adapter and computes "
            "multimodal (M-RoPE) position ids (rope mrope_section) without a model.model.get_rope_index "
            "vlmcp could call: without an adapter vlmcp would give it 1-D positions. vlmcp.hf supports "
            f"{', '.join(supported_model_types())}; register an adapter whose position_ids computes them "
            "(vlmcp.hf.register_adapter)")
    return PlaceholderAdapter(model_types=(model_type,))


def _has_mrope(text_config) -> bool:
    for name in ("rope_parameters", "rope_scaling"):
        rope = getattr(text_config, name, None)
        if isinstance(rope, dict) and "mrope_section" in rope:
            return True
    return False
