"""The long tail: transformers' image-text-to-text model types without a vlmcp adapter, on tiny configs.

:func:`tiny_long_tail_model` shrinks a model type's *default* config in code (a few layers, a narrow
width, the vocabulary kept so every special token id stays valid) and builds it seeded; :func:`long_tail`
runs one CP-vs-one-process float64 parity on it through the adapter-less path (Note [vlmcp HF long tail:
image tokens from the row]; M-RoPE models through their own rope index) and says what happened. The
measurement over every type is ``python -m vlmcp.debug.long_tail`` (docs/hf-models.md lists it).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

__all__ = ["FLOAT32", "SHRINK", "long_tail", "long_tail_types", "tiny_long_tail_model"]

FLOAT32 = 1e-6
"""The error float32 rounding in a float64 model explains (a float32 island not lifted for the type)."""

SHRINK: dict[str, int] = {
    "num_hidden_layers": 2, "depth": 2, "num_layers": 2, "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_heads": 4, "head_dim": 16, "embed_dim": 64,
    "moe_intermediate_size": 32, "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "out_hidden_size": 64,
}
"""Fields set in every sub-config that has them (``text_config``, ``vision_config``, the top level)."""


def _shrink(config, seen: set[int]) -> None:
    if id(config) in seen:
        return
    seen.add(id(config))
    for field, value in SHRINK.items():
        if isinstance(getattr(config, field, None), int) and not isinstance(getattr(config, field), bool):
            setattr(config, field, value)
    layers = getattr(config, "num_hidden_layers", None)
    for field in ("layer_types", "mlp_layer_types"):
        types = getattr(config, field, None)
        if isinstance(types, list) and layers and len(types) != layers:
            setattr(config, field, (types * layers)[:layers])
    for name in ("text_config", "vision_config"):
        sub = getattr(config, name, None)
        if sub is not None and hasattr(sub, "to_dict"):
            _shrink(sub, seen)


def tiny_long_tail_model(model_type: str, dtype: torch.dtype = torch.float64, seed: int = 0):
    """A seeded eval-mode model of ``model_type``'s default config, shrunk (:data:`SHRINK`)."""
    from transformers import AutoModelForImageTextToText
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type]()
    _shrink(config, set())
    text = getattr(config, "text_config", None)  # the vocabulary stays: placeholder ids live near its end
    if text is not None and getattr(text, "attention_dropout", 0):
        text.attention_dropout = 0.0
    for attn in ("sdpa", "eager"):  # a ViT without SDPA support: eager (the LM's becomes vlmcp's anyway)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            try:
                model = AutoModelForImageTextToText.from_config(config, attn_implementation=attn, dtype=dtype)
            except ValueError as e:
                if attn == "eager" or "does not support an attention implementation" not in str(e):
                    raise
                continue
        return model.eval()
    raise AssertionError("unreachable")


def long_tail_types() -> tuple[str, ...]:
    """transformers' image-text-to-text model types without a vlmcp adapter or a refusal by name."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    from vlmcp.hf.adapters import REFUSED, supported_model_types

    known = set(supported_model_types()) | set(REFUSED)
    return tuple(sorted(t for t in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES if t not in known))


PLACEHOLDER_SAMPLES = ((5, (1,), 9), (12,), (3, (1,), 4, (1,), 7))
"""The row of a placeholder-merge model: an image after a prompt, a text-only sample, two images."""


def long_tail(group: dist.ProcessGroup | None, model_types):
    """Per model type, what vlmcp does with its tiny model at this group's P (replicate, ring, float64).

    Rows: :data:`PLACEHOLDER_SAMPLES`, Qwen grids for the M-RoPE path. Returns one
    ``{"model_type", "status", "detail"}`` per type, status ``"exact"`` (loss and every gradient within
    1e-9 of the unmodified model), ``"float32 islands"`` (within :data:`FLOAT32`: the type's float32
    steps are not lifted in :data:`~vlmcp.debug.float64.ISLANDS`, so its float64 check rounds as
    float32 does), ``"wrong"`` (beyond that: a defect), ``"refused"`` (parallelize or shard_inputs
    named why), or ``"not built"`` (the shrunk config or its synthetic row does not build).
    """
    from vlmcp.debug.parity.hf import HFParityCase, hf_parity, reference_for
    from vlmcp.debug.tiny import DEFAULT_SAMPLES
    from vlmcp.hf.adapters import adapter_for
    from vlmcp.hf.adapters.generic import MRopePlaceholderAdapter

    out = []
    for model_type in model_types:
        try:
            model = tiny_long_tail_model(model_type)
            try:  # Qwen grids for the M-RoPE path, fixed-size images otherwise
                mrope = isinstance(adapter_for(model), MRopePlaceholderAdapter)
            except ValueError:
                mrope = False  # parallelize names why below
            case = HFParityCase(model=f"hf:{model_type}", samples=DEFAULT_SAMPLES if mrope
                                else PLACEHOLDER_SAMPLES)
            ref = reference_for(case, model)
        except Exception as e:  # noqa: BLE001  (a measurement: every failure is reported, none hidden)
            out.append({"model_type": model_type, "status": "not built",
                        "detail": f"{type(e).__name__}: {e}"})
            continue
        try:
            r = hf_parity(group, case, copy.copy(ref))
        except (ValueError, NotImplementedError) as e:
            out.append({"model_type": model_type, "status": "refused", "detail": str(e).split("\n")[0]})
            continue
        err = max(r["max_rel_grad_error"], r["loss_rel_error"])
        status = "exact" if r["passed"] else ("float32 islands" if err <= FLOAT32 else "wrong")
        out.append({"model_type": model_type, "status": status,
                    "detail": f"loss {r['loss_rel_error']:.1e}, grad {r['max_rel_grad_error']:.1e} "
                              f"({r['worst_param']})"})
    return out


def main() -> None:  # pragma: no cover  (the measurement's command line)
    import json
    import sys

    from vlmcp.launch import spawn_ranks

    types = sys.argv[1:] or list(long_tail_types())
    for row in spawn_ranks(long_tail, 2, types, timeout=1800)[0]:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
