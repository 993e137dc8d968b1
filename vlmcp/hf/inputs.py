"""``vlmcp.hf.shard_inputs``: one processor row -> this rank's ``model(**...)`` inputs.

Everything that depends on the whole row is computed on the global row first, then
sharded (PITFALLS, Hugging Face section):

* labels: HF's unshifted ``(1, L)`` with -100; shifted per sample here (a sample's last
  token has no target), then ``shard.shard_labels`` (padding is no target). HF trains
  the last image token to predict the text after it; that slot is replicated, so its
  target is kept on rank 0 only (counted once, as in one process);
* positions: the model's own rope index (Qwen M-RoPE ``get_rope_index``) per sample, as
  if the sample ran alone, then sharded; padding gets position 0, never -1 (HF's
  packed-sequence detection uses ``min()``; vlmcp's attention ignores it anyway);
* image tokens stay whole (``image_strategy="replicate"``): a split sample's on every
  rank, a whole sample's (``sample_placement="whole"``/``"auto"``) on its owner only.
  The local ``input_ids`` hold the placeholders of exactly those images, and the vision
  wrapper hands HF's merge their features in order (Note [vlmcp HF vision placement]);
  padding slots get the pad token, never the image token. A whole sample's slots are
  not replicated, so its targets stay on its owner and count once.

No ``attention_mask`` is passed: the plan is the mask. Every key of ``inputs`` is
classified by the adapter (:class:`~vlmcp.hf.adapters.InputKind`): per-token and sharded,
per-token and consumed here, per-image and passed on whole, per-video (refused for now);
a key the adapter does not handle is refused, named, never dropped (``None`` values are
ignored). Every check runs on metadata every rank holds, before any collective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.hf.adapters import HFAdapter, InputKind
from vlmcp.hf.attention import CONTEXT_KEY, CPContext
from vlmcp.hf.parallel import parallel_state
from vlmcp.layout import IGNORE_INDEX, RankShard, plan_cp
from vlmcp.layout.placement import SamplePlacement
from vlmcp.layout.validate import check_cu_seqlens

__all__ = ["HFBatch", "shard_inputs", "shift_hf_labels"]

# Why a known key cannot just be dropped (the refusal's message); any other key is unknown.
_UNHANDLED_WHY = {
    "image_sizes": "per-image sizes of any-resolution images (LLaVA-NeXT/OneVision, Mistral3), which decide "
                   "each image's tiling and token count",
    "pixel_attention_mask": "the padding mask of variable-size images (Idefics3, SmolVLM, LFM2-VL)",
    "spatial_shapes": "per-image patch grids of native-resolution images (LFM2-VL, Siglip2)",
    "image_grid_thw": "per-image patch grids (Qwen-VL-style models: their M-RoPE positions need an adapter)",
    "token_type_ids": "per-token types the model reads (Gemma 3: bidirectional attention within each image)",
    "mm_token_type_ids": "multimodal token types the model reads (M-RoPE positions, bidirectional image "
                         "masks)",
    "position_ids": "vlmcp computes the position ids on the global row itself",
    "labels": "pass labels=... to shard_inputs instead",
    "inputs_embeds": "vlmcp shards input_ids, and HF's merge runs on the local row",
    "cross_attention_mask": "cross-attention to the images (Mllama)",
    "aspect_ratio_ids": "tiled images of a cross-attention model (Mllama)",
}


@dataclass(frozen=True, eq=False)
class HFBatch:
    """What :func:`shard_inputs` returns for one rank."""

    model_inputs: dict[str, Any]
    """Keyword arguments of ``model(**...)``: logits ``(1, N, vocab)`` for this rank's slots."""
    labels: torch.Tensor
    """``LongTensor[N]`` next-token targets, -100 where there is none (padding included)."""
    shard: RankShard
    """This rank's :class:`~vlmcp.RankShard`."""
    position_ids: torch.Tensor
    """The global row's position ids ``(R, L)`` (R = 3 for M-RoPE), before sharding."""


def shift_hf_labels(labels: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """HF's unshifted labels ``(L,)`` -> next-token targets per sample ``(L,)`` (-100 at sample ends)."""
    out = torch.full_like(labels, IGNORE_INDEX)
    out[:-1] = labels[1:]
    out[(cu[1:] - 1).to(labels.device)] = IGNORE_INDEX
    return out


def _row(name: str, x, length: int | None = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[0] != 1:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be (1, L): one row (pack samples with cu_seqlens), got {shape}")
    if length is not None and x.shape[1] != length:
        raise ValueError(f"{name} has shape {tuple(x.shape)} but input_ids is (1, {length})")
    return x[0]


def _classify_keys(model: nn.Module, adapter: HFAdapter, inputs) -> dict[InputKind, list[str]]:
    """The keys of ``inputs`` by kind (``None`` values skipped); raises on any other key, and on videos."""
    out: dict[InputKind, list[str]] = {kind: [] for kind in InputKind}
    for key in inputs.keys():
        if inputs[key] is None:
            continue
        kind = adapter.input_kind(key)
        if kind is None:
            why = _UNHANDLED_WHY.get(key, "a key vlmcp does not know")
            takes = ", ".join(adapter.token_keys + adapter.consumed_keys + adapter.pixel_keys)
            model_type = getattr(model.config, "model_type", None)
            raise ValueError(
                f"inputs[{key!r}] is not handled for {type(model).__name__} (model_type={model_type!r}, "
                f"vlmcp adapter {adapter.name!r}): {why}. vlmcp would drop it and train on something else "
                "than the model expects; remove it only if the model does not read it, or register an "
                f"adapter that handles it (vlmcp.hf.register_adapter). This adapter takes {takes}")
        out[kind].append(key)
    if out[InputKind.VIDEO]:
        raise NotImplementedError(f"videos are not supported under vlmcp CP yet (inputs "
                                  f"{out[InputKind.VIDEO]})")
    return out


def _token_types(token_type: torch.Tensor, is_image: torch.Tensor) -> torch.Tensor:
    """``mm_token_type_ids`` of the row, checked: 0 text, 1 exactly at the image tokens."""
    if bool((token_type == 2).any()):
        raise NotImplementedError("mm_token_type_ids marks video tokens (2): videos are not supported under "
                                  "vlmcp CP yet")
    bad = (token_type != is_image.to(token_type.dtype)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        what = "an image" if is_image[i] else "a text"
        raise ValueError(f"mm_token_type_ids must be 1 exactly at the image tokens and 0 elsewhere; "
                         f"position {i} has {int(token_type[i])} but is {what} token")
    return token_type


def _images_per_sample(tokens: list[int] | None, is_image: torch.Tensor, cu: torch.Tensor,
                       n_images: int) -> list[list[int]]:
    """Which images (in order) each sample's image tokens take; raises on any mismatch."""
    counts = torch.zeros(cu.numel() - 1, dtype=torch.long).index_add_(
        0, torch.repeat_interleave(torch.arange(cu.numel() - 1), cu[1:] - cu[:-1]), is_image.long().cpu())
    total = int(counts.sum())
    if tokens is None:  # the adapter cannot tell: HF's own merge check raises on a mismatch
        if n_images and cu.numel() > 2:
            raise ValueError("packing samples with images needs an adapter that knows each "
                             "image's token count")
        return [list(range(n_images))]
    if sum(tokens) != total:
        raise ValueError(f"image features and image tokens do not match: the row has {total} image tokens "
                         f"but the {len(tokens)} images give {sum(tokens)} ({tokens})")
    out, i = [], 0
    for s, n in enumerate(counts.tolist()):
        first, got = i, 0
        while got < n and i < len(tokens):
            got, i = got + tokens[i], i + 1
        if got != n:
            raise ValueError(f"image features and image tokens do not match: sample {s} has {n} image tokens "
                             f"but images {first}..{i - 1} give {got} ({tokens[first:i]})")
        out.append(list(range(first, i)))
    return out


def _is_fsdp(model: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def _sharded_partitions(model: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    from vlmcp.grads import GradRule, grad_rule, restore_grad_tags

    restore_grad_tags(model)
    return any(isinstance(p, DTensor) for p in model.parameters() if grad_rule(p) is GradRule.PARTITIONED)


def shard_inputs(
    model: nn.Module,
    inputs: dict[str, Any],
    cp_group: dist.ProcessGroup | None,
    labels: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    sample_placement: SamplePlacement = "split",
) -> HFBatch:
    """This rank's inputs, targets and shard for one (packed) processor row.

    Args:
        model: a model passed to :func:`vlmcp.hf.parallelize` (with this ``cp_group``).
        inputs: the processor's output for one row, batch dimension 1: ``input_ids (1, L)``,
            optional ``attention_mask`` of ones, ``pixel_values`` (+ ``image_grid_thw`` and
            ``mm_token_type_ids`` for Qwen-VL); no pixel keys for a row without images.
            A packed row concatenates its samples' inputs in order. Every other key is
            refused unless the adapter handles it (``HFAdapter.input_kind``); ``None``
            values are ignored.
        cp_group: the CP group (the one the model was parallelized for).
        labels: HF-convention ``(1, L)``, unshifted, -100 where there is no loss; default
            ``input_ids`` with image tokens at -100.
        cu_seqlens: ``IntTensor[S+1]`` sample boundaries, or None for one sample. Samples
            are independent (no attention across them, positions restart).
        sample_placement: ``"split"`` (every sample zigzagged over the group), ``"whole"``
            (each sample on one rank, balanced by cost) or ``"auto"`` (short samples
            whole, long ones split, chosen per row by the default cost model); see Note
            [vlmcp whole-sample placement]. Every vision mode works with each: all ranks
            still compute (or gather) all images' features, and each merges its own.

    Returns:
        :class:`HFBatch` with ``model_inputs``, ``labels`` and ``shard``.

    Raises:
        ValueError: a key of ``inputs`` the model's adapter does not handle (named, with
            the architecture: e.g. ``image_sizes``, ``pixel_attention_mask``,
            ``spatial_shapes``, ``token_type_ids`` or ``mm_token_type_ids`` without an
            adapter that reads them), bad shapes, labels not matching ``input_ids``,
            ``cu_seqlens`` not covering the row, image tokens not matching the images
            (or ``mm_token_type_ids``), a group other than the model's, or whole
            placement of a row with images on a model without a vlmcp adapter (all
            before any communication).
        NotImplementedError: videos (the adapter's video keys, or video token types).
    """
    state = parallel_state(model)
    if cp_group is not state.group:
        raise ValueError("cp_group is not the group this model was parallelized for")
    if not isinstance(inputs, dict) and not hasattr(inputs, "keys"):
        raise TypeError(f"inputs must be the processor's dict, got {type(inputs).__name__}")
    if inputs.get("input_ids") is None:
        raise ValueError("inputs must hold input_ids (1, L)")
    adapter, config = state.adapter, model.config
    keys = _classify_keys(model, adapter, inputs)
    ids = _row("input_ids", inputs["input_ids"])
    L = ids.numel()
    if L == 0:
        raise ValueError("input_ids is empty")
    per_token = {k: _row(k, inputs[k], L) for k in keys[InputKind.TOKENS] + keys[InputKind.CONSUMED]}
    mask = per_token.get("attention_mask")
    if mask is not None and not bool((mask == 1).all()):
        raise ValueError("attention_mask must be all ones: no padding inside a row (pack samples with "
                         "cu_seqlens instead)")
    if labels is not None:
        _row("labels", labels, L)
    cu = check_cu_seqlens(cu_seqlens, L)
    image_id = adapter.image_token_id(config)
    is_image = (ids == image_id).cpu()
    pixels = {k: inputs[k] for k in keys[InputKind.IMAGE]}
    has_pixels = bool(pixels) and (adapter.pixel_keys[0] in pixels)
    if not has_pixels and bool(is_image.any()):
        raise ValueError(f"image features and image tokens do not match: the row has {int(is_image.sum())} "
                         "image tokens but no pixel_values")
    tokens = adapter.image_tokens(model, pixels) if has_pixels else []
    n_images = len(tokens) if tokens is not None else 1
    groups = _images_per_sample(tokens, is_image, cu, n_images if has_pixels else 0)
    token_type = per_token.get("mm_token_type_ids")
    token_type = is_image.int() if token_type is None else _token_types(token_type.cpu(), is_image)

    fsdp = _is_fsdp(model)
    if fsdp and state.vision_mode in ("broadcast", "scatter"):
        raise ValueError(
            f"vision_mode={state.vision_mode!r} does not work under FSDP: some CP ranks skip (part of) the "
            "ViT, so FSDP's collectives no longer match across ranks; use 'replicate', 'allreduce_hook' or "
            "'hidden_shard' with FSDP, or vlmcp.reduce_gradients without it")
    if fsdp and state.vision_mode == "hidden_shard" and _sharded_partitions(model):
        raise ValueError(
            "hidden_shard under FSDP: the projector slice differs per CP rank and must stay out of FSDP; "
            "pass fully_shard(..., ignored_params={p for n, p in model.named_parameters() if n in "
            "vlmcp.ddp_ignored_params(model)}) and call vlmcp.finish_ddp_gradients after backward")
    placements = get_args(SamplePlacement)
    if sample_placement not in placements:
        raise ValueError(f"sample_placement must be one of {placements}, got {sample_placement!r}")
    if sample_placement != "split" and has_pixels and not adapter.vision_modules:
        raise ValueError(f"sample_placement={sample_placement!r} with images needs a vlmcp adapter (the "
                         "vision wrapper gives each rank its own images' features); this model has none: "
                         "use sample_placement='split' or register one (vlmcp.hf.register_adapter)")
    cp_size = state.cp_size
    rank = 0 if cp_group is None else dist.get_rank(cp_group)
    plan = plan_cp(is_image, cp_size, cu, image_strategy="replicate", sample_placement=sample_placement)
    shard = plan.for_rank(rank)

    ids_cpu = ids.cpu()
    parts = []
    for s in range(cu.numel() - 1):
        a, b = int(cu[s]), int(cu[s + 1])
        sub = adapter.select_images(pixels, groups[s]) if has_pixels and tokens is not None else pixels
        parts.append(adapter.position_ids(model, ids_cpu[a:b], token_type[a:b], sub).cpu())
    positions = torch.cat(parts, dim=-1)  # (R, L)

    targets = labels[0] if labels is not None else torch.where(is_image.to(ids.device), IGNORE_INDEX, ids)
    targets = shift_hf_labels(targets.long(), cu.to(targets.device))
    pad_id = getattr(config.text_config, "pad_token_id", None)
    if pad_id is None or pad_id == image_id:  # a padding slot must never look like an image token
        pad_id = 1 if image_id == 0 else 0
    device = ids.device
    model_inputs: dict[str, Any] = {  # padding slots: the pad token in input_ids, 0 in other token keys
        k: shard.shard(per_token[k], fill=pad_id if k == "input_ids" else 0).unsqueeze(0)
        for k in keys[InputKind.TOKENS]}
    local_positions = shard.shard(positions, dim=-1, fill=0)
    model_inputs["position_ids"] = adapter.model_position_ids(local_positions).to(device)
    model_inputs["use_cache"] = False
    dummy = False
    if has_pixels:
        model_inputs.update(pixels)
    elif adapter.vision_modules and (state.dummy_vision or (state.dummy_vision is None and fsdp)):
        model_inputs.update(adapter.dummy_images(model))
        dummy = True
    ctx = CPContext(shard=shard, group=cp_group, backend=state.attention, dummy_vision=dummy)
    model_inputs[CONTEXT_KEY] = ctx
    local_targets = shard.shard_labels(targets)
    if rank > 0:  # a replicated slot's target (the last image token predicts the text after it) counts once
        local_targets = local_targets.masked_fill(shard.replicated.to(local_targets.device), IGNORE_INDEX)
    return HFBatch(model_inputs=model_inputs, labels=local_targets, shard=shard, position_ids=positions)
