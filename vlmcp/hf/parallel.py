"""``vlmcp.hf.parallelize``: put a Hugging Face VLM on a CP group, in place, once.

It sets vlmcp's attention on the language model only (Note [vlmcp HF attention:
registered for the LLM, shard passed with the inputs]), installs the vision mode
(Note [vlmcp HF vision placement]) and records both on the model for
:func:`vlmcp.hf.shard_inputs`. Every check runs before anything is changed and
before any communication, the token-mixer audit included (Note [vlmcp HF token
mixers]): a language model with anything mixing tokens but softmax attention and the
mixers vlmcp runs under CP (Qwen3.5's Gated DeltaNet, :mod:`vlmcp.hf.layers.gdn`; LFM2's short
convolutions, :mod:`vlmcp.hf.layers.short_conv`; Nemotron-H's Mamba-2, :mod:`vlmcp.hf.layers.mamba2`;
sliding-window attention whose module carries its ``sliding_window``, Gemma 3) is refused, module
by module (other Mamba classes, chunked attention...). With ``ep_group`` the MoE layers' routed
experts are sharded over it (:mod:`vlmcp.hf.moe`: Note [vlmcp expert parallel: dispatch and combine]),
every refusal of an experts module vlmcp cannot shard raised with the others, before any change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch.distributed as dist
from torch import nn

from vlmcp.deps import check_versions
from vlmcp.hf import attention as hf_attention
from vlmcp.hf.adapters import HFAdapter, adapter_for, submodule
from vlmcp.hf.layers import gdn as hf_gdn
from vlmcp.hf.layers import llama4 as hf_llama4
from vlmcp.hf.layers import mamba2 as hf_mamba2
from vlmcp.hf.layers import short_conv as hf_short_conv
from vlmcp.hf.layers.audit import audit_token_mixers
from vlmcp.hf.moe.shard import apply_expert_parallel, plan_expert_parallel
from vlmcp.hf.peft import check_hidden_shard_layers, unwrap_peft
from vlmcp.hf.vision_placement import place_hf_vision
from vlmcp.vision.placement import VisionMode

__all__ = ["HFParallel", "parallelize", "parallel_state"]

_ATTR = "_vlmcp_hf"


@dataclass(frozen=True, kw_only=True, eq=False)
class HFParallel:
    """What :func:`parallelize` fixed for a model (read by :func:`vlmcp.hf.shard_inputs`)."""

    group: dist.ProcessGroup | None
    """The CP group (None: one process)."""
    cp_size: int
    """P."""
    attention: Literal["ring", "ulysses"]
    """``cp_attention``'s backend."""
    vision_mode: VisionMode
    """How image features are computed (Note [vlmcp HF vision placement])."""
    adapter: HFAdapter
    """The architecture's adapter."""
    dummy_vision: bool | None
    """Run the ViT on a blank image for rows without images: True, False, or None = when FSDP-sharded."""
    check_same_row: bool = True
    """``shard_inputs``' row guard by default (Note [vlmcp row guard: one row per CP group])."""
    ep_group: dist.ProcessGroup | None = None
    """The expert-parallel group (None: the experts are not sharded)."""
    ep_size: int = 1
    """E (1 also with a one-rank ``ep_group``: every expert here, the EP forward's counts kept)."""

    def __deepcopy__(self, memo):
        return self


def parallel_state(model: nn.Module) -> HFParallel:
    """The model's :class:`HFParallel`; raises if :func:`parallelize` was not called."""
    state = getattr(unwrap_peft(model), _ATTR, None)
    if state is None:
        raise ValueError(f"{type(model).__name__} is not parallelized: call "
                         "vlmcp.hf.parallelize(model, cp_group, ...) once, before the optimizer")
    return state


def parallelize(
    model: nn.Module,
    cp_group: dist.ProcessGroup | None,
    attention: Literal["ring", "ulysses"] = "ring",
    vision_mode: VisionMode = "replicate",
    *,
    src: int = 0,
    dummy_vision: bool | None = None,
    check_same_row: bool = True,
    ep_group: dist.ProcessGroup | None = None,
) -> nn.Module:
    """Run ``model``'s language model under context parallelism over ``cp_group`` (in place).

    Call it once on every rank, after loading identical weights and before building the
    optimizer (``hidden_shard`` replaces the projector's last Linear by this rank's slice)
    and before ``fully_shard``/DDP. Then feed ``model(**vlmcp.hf.shard_inputs(...).model_inputs)``.

    Args:
        model: a ``Qwen2VLForConditionalGeneration``, ``Qwen2_5_VLForConditionalGeneration``,
            ``LlavaForConditionalGeneration``, a model with a registered adapter, or another
            LLaVA-like placeholder-merge VLM (1-D positions, ``pixel_values`` only: ``replicate``).
        cp_group: the CP process group (explicit, never the global one), or None for one process.
        attention: ``"ring"`` or ``"ulysses"`` (needs attention heads divisible by P).
        vision_mode: ``replicate``, ``allreduce_hook``, ``broadcast``, ``scatter`` or
            ``hidden_shard`` (the last three need the architecture's adapter).
        src: ``broadcast``'s source rank within ``cp_group``.
        dummy_vision: on rows without an image, run the ViT on one blank image so every
            vision parameter gets a (zero) gradient, which FSDP/DDP over DP x CP need; None
            (default) does so when the model is FSDP-sharded at ``shard_inputs`` time.
        check_same_row: :func:`vlmcp.hf.shard_inputs` checks by default that every rank of
            the CP group holds the same row (one all-gather of 32 bytes per rank per call:
            Note [vlmcp row guard: one row per CP group]); False turns it off for this
            model once the loader is trusted (each call can still override it).
        ep_group: expert parallelism: each MoE layer's routed experts sharded over this group
            of E ranks, taken from the DP x CP world (:func:`vlmcp.hf.moe.expert_groups`), E
            dividing the expert count; tokens reach their experts by all-to-all (every rank of
            the group must run every forward and backward). Reduce with
            ``vlmcp.reduce_gradients(..., expert_dp_group=)``. A one-rank group shards nothing but
            keeps the per-expert counts (:func:`vlmcp.hf.moe.expert_load`). None: experts untouched.

    Returns:
        ``model`` (a ``peft.PeftModel`` is taken as is and its model parallelized: :mod:`vlmcp.hf.peft`).

    Raises:
        ValueError: unsupported architecture, unknown attention or vision mode, a mode
            without an adapter, heads not divisible by P for Ulysses, a projector width not
            divisible by P for ``hidden_shard`` or a last layer it cannot slice (a DoRA adapter
            around it, say), dropout in the LLM, a model parallelized
            already, or a token mixer vlmcp does not run under CP (linear attention other than
            Qwen3.5's Gated DeltaNet, convolutions other than LFM2's, Mamba other than Nemotron-H's
            Mamba-2, chunked windows,
            sliding windows HF's mask alone applies, sinks, attention outside
            ``ALL_ATTENTION_FUNCTIONS``; the message names each module, its class and why),
            also with ``cp_group=None``; with ``ep_group``, an experts module vlmcp cannot shard
            (an unknown class named ``*Experts``, experts as an ``nn.ModuleList``, biases),
            capacity-limited routing, no experts, or E not dividing the expert count.
        vlmcp.deps.UntestedVersion: transformers outside the tested range (:mod:`vlmcp.deps`).
    """
    check_versions("transformers")
    outer, model = model, unwrap_peft(model)  # a peft.PeftModel: the model inside (vlmcp.hf.peft)
    if attention not in ("ring", "ulysses"):
        raise ValueError(f"attention must be 'ring' or 'ulysses', got {attention!r}")
    if vision_mode not in get_args(VisionMode):
        raise ValueError(f"vision_mode must be one of {get_args(VisionMode)}, got {vision_mode!r}")
    if getattr(model, _ATTR, None) is not None:
        raise ValueError("this model is parallelized already (call parallelize once)")
    adapter = adapter_for(model)  # unsupported architectures raise here
    if vision_mode not in adapter.vision_modes:
        raise ValueError(
            f"vision_mode={vision_mode!r} needs a vlmcp adapter that names the ViT call and the projector's "
            f"last Linear; {type(model).__name__} (model_type={model.config.model_type!r}) supports "
            f"{adapter.vision_modes}")
    if not isinstance(check_same_row, bool):
        raise TypeError(f"check_same_row must be True or False, got {check_same_row!r}")
    if cp_group is not None and not isinstance(cp_group, dist.ProcessGroup):
        raise TypeError(f"cp_group must be a ProcessGroup or None, got {type(cp_group).__name__}")
    world = 1 if cp_group is None else dist.get_world_size(cp_group)
    if not (isinstance(src, int) and not isinstance(src, bool) and 0 <= src < world):
        raise ValueError(f"src must be a rank of the CP group, an int in [0, {world}), got {src!r}")
    text = model.config.text_config
    if attention == "ulysses" and text.num_attention_heads % world:
        raise ValueError(f"ulysses needs attention heads divisible by the CP size: "
                         f"num_attention_heads={text.num_attention_heads}, P={world}")
    if getattr(text, "attention_dropout", 0.0):
        raise ValueError(f"vlmcp attention has no dropout; set text_config.attention_dropout=0 "
                         f"(got {text.attention_dropout})")
    if vision_mode == "hidden_shard" and world > 1:
        out = submodule(model, adapter.projector_last).out_features
        if out % world:
            raise ValueError(f"hidden_shard splits the projector output ({out} columns) over the CP group, "
                             f"but {out} is not divisible by P={world}")
        check_hidden_shard_layers(model, (adapter.projector_last, *adapter.deepstack_projectors(model)))
    submodule(model, adapter.language_model)  # names the architecture if the path is wrong
    # Qwen3.5's Gated DeltaNet, LFM2's short conv, Nemotron-H's Mamba-2, Llama 4's attention
    for mixer_implementation in (hf_gdn, hf_short_conv, hf_mamba2, hf_llama4):
        mixer_implementation.register()  # classes of loaded transformers modules only: imports nothing
    mixers = audit_token_mixers(model, adapter.language_model)
    experts = plan_expert_parallel(model, adapter.language_model, ep_group) if ep_group is not None else []
    adapter.prepare_model(model)
    for mixer in mixers:
        mixer.prepare(mixer.module)
    hf_attention.register()
    model.set_attn_implementation({"text_config": hf_attention.ATTN_NAME})
    place_hf_vision(model, adapter, vision_mode, cp_group, src)
    if ep_group is not None:
        apply_expert_parallel(model, experts, ep_group, cp_size=world)
    setattr(model, _ATTR, HFParallel(group=cp_group, cp_size=world, attention=attention,
                                     vision_mode=vision_mode, adapter=adapter, dummy_vision=dummy_vision,
                                     check_same_row=check_same_row, ep_group=ep_group,
                                     ep_size=1 if ep_group is None else dist.get_world_size(ep_group)))
    return outer
