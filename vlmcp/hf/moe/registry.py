"""The routed-experts classes vlmcp shards over an EP group: one entry per class, found by class name.

A transformers MoE block is a router (kept as HF wrote it, on the rank that holds the tokens), maybe
shared experts or a dense MLP beside it (kept, replicated), and one *routed experts* module holding
every expert's weights as stacked 3-D parameters ``(num_experts, out, in)``. That module is what
expert parallelism replaces (:mod:`vlmcp.hf.moe.shard`). Its class must be one of :data:`EXPERTS`:
:func:`find_experts` refuses, by path and class, any other module that looks like routed experts
(a class named ``*Experts`` vlmcp does not know, experts as an ``nn.ModuleList``), and a config with
capacity-limited (token-dropping) routing, before anything is changed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

__all__ = ["EXPERTS", "MODEL_TYPES", "ExpertsSpec", "check_routing", "expert_count", "find_experts",
           "register_experts"]


@dataclass(frozen=True, kw_only=True)
class ExpertsSpec:
    """How one routed-experts class holds its weights and what its block does around it."""

    class_name: str
    """The class (``type(module).__name__``)."""
    up: str = "gate_up_proj"
    """The first projection's parameter: ``gate_up_proj`` (gate and up concatenated) or ``up_proj``."""
    gated: bool = True
    """``act(gate) * up`` (the class's own ``_apply_gate`` where it has one) rather than ``act(up)``."""
    transposed: bool = False
    """Weights stored ``(E, in, out)`` (Llama 4) rather than ``(E, out, in)``."""
    scaled_input: bool = False
    """The block scales each expert's *input* by the router score and adds the outputs unweighted
    (Llama 4), rather than weighting the outputs."""


EXPERTS: dict[str, ExpertsSpec] = {}
"""Every routed-experts class vlmcp shards, by class name."""


def register_experts(spec: ExpertsSpec) -> None:
    """Add (or replace) a routed-experts class; its block's forward must call ``experts(hidden (T, H),
    top_k_index (T, K), top_k_weights (T, K))`` (or be replaced, as :mod:`vlmcp.hf.moe.llama4` does)."""
    EXPERTS[spec.class_name] = spec


for _name in ("Qwen3VLMoeTextExperts", "Qwen3_5MoeExperts", "Glm4vMoeTextExperts", "DeepseekV3Experts",
              "Gemma4TextExperts", "MiniMaxM3VLExperts", "Mistral4Experts"):
    register_experts(ExpertsSpec(class_name=_name))
register_experts(ExpertsSpec(class_name="NemotronHExperts", up="up_proj", gated=False))
register_experts(ExpertsSpec(class_name="Llama4TextExperts", transposed=True, scaled_input=True))

MODEL_TYPES: dict[str, str] = {
    "qwen3_vl_moe_text": "Qwen3VLMoeTextExperts", "qwen3_5_moe_text": "Qwen3_5MoeExperts",
    "glm4v_moe_text": "Glm4vMoeTextExperts", "deepseek_v3": "DeepseekV3Experts",
    "gemma4_text": "Gemma4TextExperts", "minimax_m3_vl_text": "MiniMaxM3VLExperts",
    "mistral4": "Mistral4Experts", "nemotron_h": "NemotronHExperts", "llama4_text": "Llama4TextExperts",
}
"""Text ``model_type`` -> its routed-experts class, for :func:`vlmcp.hf.moe.check_ep` (config only)."""

_LOOKS_LIKE_EXPERTS = re.compile(r"Experts$")
_SHARED = re.compile(r"Shared", re.I)
_CAPACITY_FIELDS = ("capacity_factor", "moe_capacity_factor", "expert_capacity", "moe_expert_capacity",
                    "train_capacity_factor", "moe_token_dropping", "drop_tokens", "moe_drop_tokens",
                    "token_drop_policy", "moe_token_drop_policy")
_COUNT_FIELDS = ("num_experts", "n_routed_experts", "num_local_experts")


def expert_count(text_config) -> int | None:
    """The routed expert count a text config declares (None: a dense model)."""
    if getattr(text_config, "enable_moe_block", True) is False:  # Gemma 4 without its MoE block
        return None
    for name in _COUNT_FIELDS:
        value = getattr(text_config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def check_routing(text_config) -> None:
    """Refuse a router that caps the tokens per expert (vlmcp's dispatch is dropless), by field."""
    for name in _CAPACITY_FIELDS:
        value = getattr(text_config, name, None)
        if value not in (None, False, 0, "none", ""):
            raise ValueError(f"{type(text_config).__name__}.{name}={value!r}: capacity-limited routing drops "
                             "tokens; vlmcp's expert parallel is dropless and cannot reproduce it")


def _check_flags(path: str, module: nn.Module, spec: ExpertsSpec) -> None:
    """A decorated class's layout flags (transformers' ``use_experts_implementation``) must be the spec's."""
    want = {"has_bias": False, "has_post_expert_norm": False, "is_concatenated": True,
            "has_gate": spec.gated, "is_transposed": spec.transposed, "_is_expert_parallel": False}
    for flag, value in want.items():
        if hasattr(module, flag) and bool(getattr(module, flag)) != value:
            raise ValueError(f"{path} ({type(module).__name__}) has {flag}={getattr(module, flag)!r}: "
                             f"vlmcp's expert parallel computes experts with {flag}={value}")
    for name in (spec.up, "down_proj"):
        p = getattr(module, name, None)
        if not isinstance(p, nn.Parameter) or p.dim() != 3:
            raise ValueError(f"{path} ({type(module).__name__}) has no 3-D parameter {name!r}")
    extra = sorted(n for n, _ in module.named_parameters() if n not in (spec.up, "down_proj"))
    if extra:
        raise ValueError(f"{path} ({type(module).__name__}) has parameters {extra} besides {spec.up} and "
                         "down_proj: vlmcp's expert parallel would not slice them")


def find_experts(model: nn.Module, root: str) -> list[tuple[str, nn.Module, ExpertsSpec]]:
    """Every routed-experts module under ``model.<root>`` (the language model), in module order.

    Raises:
        ValueError: a module that looks like routed experts but is not in :data:`EXPERTS` (a class
            named ``*Experts``, or an ``nn.ModuleList`` named ``experts``), a known class whose
            layout differs from its entry (biases, a post-expert norm, HF's own expert parallel
            applied), naming its path and class.
    """
    lm = model.get_submodule(root)
    found = []
    for name, module in lm.named_modules():
        path = f"{root}.{name}" if name else root
        cls = type(module).__name__
        spec = EXPERTS.get(cls)
        for base in type(module).__mro__[1:]:  # FSDP2 and wrappers subclass the HF class
            spec = spec or EXPERTS.get(base.__name__)
        if spec is not None:
            _check_flags(path, module, spec)
            found.append((path, module, spec))
        elif isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] == "experts":
            raise ValueError(f"{path} holds its experts as an nn.ModuleList of {len(module)} modules: "
                             "vlmcp's expert parallel shards stacked 3-D expert weights only (transformers "
                             "5.x layout)")
        elif _LOOKS_LIKE_EXPERTS.search(cls) and not _SHARED.search(cls):
            raise ValueError(f"{path} is a {cls}, a routed-experts class vlmcp's expert parallel does not "
                             f"know (known: {sorted(EXPERTS)}); register it with "
                             "vlmcp.hf.moe.register_experts")
    return found
