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
* visual tokens (image and video placeholders) follow ``image_strategy``. Under
  ``"replicate"`` they stay whole: a split sample's on every rank, a whole sample's
  (``sample_placement="whole"``/``"auto"``) on its owner only. Under ``"shard"`` a split
  sample's visual and text tokens are zigzagged together (``"auto"``: the cost model picks
  one of the two per row). Either way the local ``input_ids`` hold the placeholders of
  exactly the visual tokens this rank holds, and the vision wrapper hands HF's image and
  video merges the feature rows of those tokens, in order (Note [vlmcp HF vision
  placement]); padding slots get the pad token, never a placeholder. Non-replicated
  slots' targets stay on their owner and count once;
* videos (Note [vlmcp HF videos: frame groups are visual units] in :mod:`vlmcp.hf.visual_tokens`):
  the unit of visual identity is an image or one temporal patch group (frame group) of a
  video, numbered in row order and passed to the plan as ``image_ids``; each sample's
  videos (and Qwen2.5-VL's ``second_per_grid_ts``) go to its rope index, so Qwen3-VL's and
  GLM-4.1V's timestamps between frame groups keep their positions.

No ``attention_mask`` is passed: the plan is the mask. Every key of ``inputs`` is
classified by the adapter (:class:`~vlmcp.hf.adapters.InputKind`): per-token and sharded,
per-token and consumed here, per-image and per-video and passed on whole (videos refused
where the adapter takes none); a key the adapter does not handle is refused, named, never
dropped (``None`` values are ignored). Every check runs on metadata every rank holds,
before any collective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.grads import GradRule, grad_rule, restore_grad_tags
from vlmcp.hf import row_guard
from vlmcp.hf.adapters import HFAdapter, InputKind
from vlmcp.hf.attention import CONTEXT_KEY, CPContext
from vlmcp.hf.parallel import parallel_state
from vlmcp.hf.peft import unwrap_peft
from vlmcp.hf.visual_tokens import RowVisuals, row_visuals
from vlmcp.layout import IGNORE_INDEX, RankShard, plan_cp
from vlmcp.layout.plan import ImageStrategy
from vlmcp.layout.sample_placement import SamplePlacement
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
    "second_per_grid_ts": "seconds per temporal patch group of each video (Qwen2.5-VL's temporal "
                          "positions), which this model does not read",
    "position_ids": "vlmcp computes the position ids on the global row itself",
    "labels": "pass labels=... to shard_inputs instead",
    "inputs_embeds": "vlmcp shards input_ids, and HF's merge runs on the local row",
    "cross_attention_mask": "cross-attention to the images (Mllama)",
    "aspect_ratio_ids": "tiled images of a cross-attention model (Mllama)",
    "input_features": "audio features (Nemotron-H-Omni's Parakeet encoder), which vlmcp does not place",
    "input_features_mask": "the padding mask of audio features (Nemotron-H-Omni)",
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
    """The keys of ``inputs`` by kind (``None`` values skipped); raises on any other key, and on videos
    for an adapter that takes none."""
    out: dict[InputKind, list[str]] = {kind: [] for kind in InputKind}
    for key in inputs.keys():
        if inputs[key] is None:
            continue
        kind = adapter.input_kind(key)
        if kind is None:
            why = _UNHANDLED_WHY.get(key, "a key vlmcp does not know")
            takes = ", ".join(adapter.token_keys + adapter.consumed_keys + adapter.pixel_keys
                              + (adapter.video_keys if adapter.takes_videos else ()))
            model_type = getattr(model.config, "model_type", None)
            raise ValueError(
                f"inputs[{key!r}] is not handled for {type(model).__name__} (model_type={model_type!r}, "
                f"vlmcp adapter {adapter.name!r}): {why}. vlmcp would drop it and train on something else "
                "than the model expects; remove it only if the model does not read it, or register an "
                f"adapter that handles it (vlmcp.hf.register_adapter). This adapter takes {takes}")
        out[kind].append(key)
    if out[InputKind.VIDEO] and not adapter.takes_videos:
        raise NotImplementedError(f"videos are not supported under vlmcp CP for {type(model).__name__} "
                                  f"(vlmcp adapter {adapter.name!r}; inputs {out[InputKind.VIDEO]}): "
                                  "Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, GLM-4.1V and LLaVA-OneVision "
                                  "take them")
    if out[InputKind.VIDEO] and adapter.video_pixel_keys[0] not in out[InputKind.VIDEO]:
        raise ValueError(f"video inputs {out[InputKind.VIDEO]} without {adapter.video_pixel_keys[0]}: pass "
                         "the videos' pixels with their grids, or none of the video keys")
    return out


def _is_fsdp(model: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def _sharded_partitions(model: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    restore_grad_tags(model)
    return any(isinstance(p, DTensor) for p in model.parameters() if grad_rule(p) is GradRule.PARTITIONED)


def shard_inputs(
    model: nn.Module,
    inputs: dict[str, Any],
    cp_group: dist.ProcessGroup | None,
    labels: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    sample_placement: SamplePlacement = "split",
    image_strategy: ImageStrategy | Literal["auto"] = "replicate",
    *,
    check_same_row: bool | None = None,
) -> HFBatch:
    """This rank's inputs, targets and shard for one (packed) processor row.

    Args:
        model: a model passed to :func:`vlmcp.hf.parallelize` (with this ``cp_group``).
        inputs: the processor's output for one row, batch dimension 1: ``input_ids (1, L)``,
            optional ``attention_mask`` of ones, ``pixel_values`` (+ ``image_grid_thw`` and
            ``mm_token_type_ids`` for Qwen-VL), ``pixel_values_videos`` + ``video_grid_thw``
            (+ ``second_per_grid_ts``, Qwen2.5-VL) for videos; no pixel keys for a row
            without images or videos. A packed row concatenates its samples' inputs in
            order (images and videos each in row order). Every other key is refused unless
            the adapter handles it (``HFAdapter.input_kind``); ``None`` values are ignored.
        cp_group: the CP group (the one the model was parallelized for).
        labels: HF-convention ``(1, L)``, unshifted, -100 where there is no loss; default
            ``input_ids`` with image and video tokens at -100.
        cu_seqlens: ``IntTensor[S+1]`` sample boundaries, or None for one sample. Samples
            are independent (no attention across them, positions restart).
        sample_placement: ``"split"`` (every sample zigzagged over the group), ``"whole"``
            (each sample on one rank, balanced by cost) or ``"auto"`` (short samples
            whole, long ones split, chosen per row by the default cost model); see Note
            [vlmcp whole-sample placement]. Every vision mode works with each: all ranks
            still compute (or gather) all images' features, and each merges its own.
        image_strategy: where a split sample's visual (image and video) tokens live:
            ``"replicate"`` (every rank holds all of them; only text is zigzagged),
            ``"shard"`` (the whole merged sample is zigzagged: visual K/V travel in ring
            and Ulysses like text, and each rank merges only the feature rows of the
            visual tokens it holds) or ``"auto"`` (the default :class:`~vlmcp.CostModel`
            prices both layouts of the row and keeps the cheaper: one decision per row,
            not per image), as :func:`vlmcp.plan_cp`.
        check_same_row: check that every rank of ``cp_group`` holds this same row (one
            all-gather of 32 bytes per rank, after the local checks and before any other
            collective: Note [vlmcp row guard: one row per CP group]); None (default): as
            :func:`vlmcp.hf.parallelize` set it for the model (on unless turned off there).
            Turn it off once a loader is trusted to give the CP group one row.

    Returns:
        :class:`HFBatch` with ``model_inputs``, ``labels`` and ``shard``.

    Raises:
        ValueError: a key of ``inputs`` the model's adapter does not handle (named, with
            the architecture: e.g. ``image_sizes``, ``pixel_attention_mask``,
            ``spatial_shapes``, ``token_type_ids`` or ``mm_token_type_ids`` without an
            adapter that reads them), bad shapes, labels not matching ``input_ids``,
            ``cu_seqlens`` not covering the row, image or video tokens not matching the
            images or videos (or ``mm_token_type_ids``), a frame group or image cut by
            other tokens, images and videos in one row of a model whose forward cannot
            merge both (GLM-4.1V), a group other than the model's, or whole placement or
            sharded visual tokens of a row with images on a model without a vlmcp adapter
            (all before any communication).
        NotImplementedError: videos for an architecture whose adapter takes none.
        ValueError: (the row guard, on every rank) the ranks of ``cp_group`` hold different
            rows; the message names which ranks hold which.
    """
    model = unwrap_peft(model)  # a peft.PeftModel: its model (vlmcp.hf.peft)
    state = parallel_state(model)
    _check_call(state, cp_group, inputs, sample_placement, image_strategy)
    row = _read_row(model, state.adapter, inputs, labels, cu_seqlens)
    _check_layout(model, state, row, sample_placement, image_strategy)
    _check_same_row(state, row, check_same_row)
    rank = 0 if cp_group is None else dist.get_rank(cp_group)
    plan = plan_cp(row.visuals.visual, state.cp_size, row.cu, image_strategy=image_strategy,
                   image_ids=row.visuals.unit_ids, sample_placement=sample_placement)
    shard = plan.for_rank(rank)
    positions = _positions(model, state.adapter, row)
    model_inputs = _local_inputs(model, state, row, shard, positions)
    return HFBatch(model_inputs=model_inputs, labels=_local_targets(row, shard, rank), shard=shard,
                   position_ids=positions)


@dataclass(frozen=True, eq=False)
class _Row:
    """One processor row, read and checked on the global row (every rank holds the same)."""

    ids: torch.Tensor
    """``LongTensor[L]`` on the inputs' device."""
    keys: dict[InputKind, list[str]]
    """The inputs' keys by kind."""
    per_token: dict[str, torch.Tensor]
    """Every per-token key (sharded and consumed), ``(L,)``."""
    pixels: dict[str, Any]
    """The per-image keys."""
    videos: dict[str, Any]
    """The per-video keys."""
    labels: torch.Tensor | None
    """The caller's HF-convention labels ``(L,)``, or None."""
    cu: torch.Tensor
    """``cu_seqlens``, checked."""
    visuals: RowVisuals
    """Which tokens are which image, video and frame group."""
    has_pixels: bool
    """The row has images (its first pixel key is present)."""


def _check_call(state, cp_group, inputs, sample_placement, image_strategy) -> None:
    """The arguments themselves: the model's group, a processor dict, known choices."""
    if cp_group is not state.group:
        raise ValueError("cp_group is not the group this model was parallelized for")
    if not isinstance(inputs, dict) and not hasattr(inputs, "keys"):
        raise TypeError(f"inputs must be the processor's dict, got {type(inputs).__name__}")
    if inputs.get("input_ids") is None:
        raise ValueError("inputs must hold input_ids (1, L)")
    strategies = (*get_args(ImageStrategy), "auto")
    if image_strategy not in strategies:
        raise ValueError(f"image_strategy must be one of {strategies}, got {image_strategy!r}")


def _read_row(model: nn.Module, adapter: HFAdapter, inputs, labels, cu_seqlens) -> _Row:
    """Classify every key, check the shapes, and find the row's visual tokens and units."""
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
    row_labels = None if labels is None else _row("labels", labels, L)
    cu = check_cu_seqlens(cu_seqlens, L)
    pixels = {k: inputs[k] for k in keys[InputKind.IMAGE]}
    videos = {k: inputs[k] for k in keys[InputKind.VIDEO]}
    given = per_token.get("mm_token_type_ids")
    adapter.check_row(model, tuple(inputs), bool(pixels))
    visuals = row_visuals(model, adapter, ids.cpu(), None if given is None else given.cpu(), pixels, videos,
                          cu)
    _check_image_blocks(model, adapter, keys, per_token, visuals, cu)
    return _Row(ids=ids, keys=keys, per_token=per_token, pixels=pixels, videos=videos, labels=row_labels,
                cu=cu, visuals=visuals, has_pixels=adapter.pixel_keys[0] in pixels)


def _check_image_blocks(model, adapter, keys, per_token, visuals: RowVisuals, cu) -> None:
    """Gemma-style bidirectional images: ``token_type_ids`` marks exactly the image tokens, and no two
    images touch (the model would join them into one block)."""
    types = visuals.types
    token_type_ids = per_token.get("token_type_ids") if "token_type_ids" in keys[InputKind.CONSUMED] else None
    if token_type_ids is not None and not torch.equal(token_type_ids.cpu() == 1, types == 1):
        raise ValueError("token_type_ids must be 1 exactly at the image tokens (Gemma 3's image blocks, "
                         f"whose tokens attend bidirectionally): {int((token_type_ids == 1).sum())} ones for "
                         f"{int((types == 1).sum())} image tokens, or at other positions")
    if adapter.image_attention == "bidirectional" and visuals.unit_ids is not None:
        u, starts = visuals.unit_ids, torch.zeros(types.numel(), dtype=torch.bool)
        starts[cu[:-1].long()] = True
        joined = (u[1:] >= 0) & (u[:-1] >= 0) & (u[1:] != u[:-1]) & ~starts[1:]
        if bool(joined.any()):
            at = int(torch.nonzero(joined)[0]) + 1
            raise ValueError(f"two images back to back at token {at}: {type(model).__name__} attends "
                             "bidirectionally within each run of image tokens, so the model would join them "
                             "into one block; put a text token (the processor's end/start-of-image) between")


def _check_layout(model: nn.Module, state, row: _Row, sample_placement, image_strategy) -> None:
    """What the vision mode, FSDP and the adapter allow of the requested layout."""
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
    own_features = bool(state.adapter.vision_modules)
    if sample_placement != "split" and row.has_pixels and not own_features:
        raise ValueError(f"sample_placement={sample_placement!r} with images needs a vlmcp adapter (the "
                         "vision wrapper gives each rank its own images' features); this model has none: "
                         "use sample_placement='split' or register one (vlmcp.hf.register_adapter)")
    if image_strategy != "replicate" and row.has_pixels and not own_features:
        raise ValueError(f"image_strategy={image_strategy!r} with images needs a vlmcp adapter (the vision "
                         "wrapper gives each rank the features of the image tokens it holds); this model has "
                         "none: use image_strategy='replicate' or register one (vlmcp.hf.register_adapter)")


def _check_same_row(state, row: _Row, check: bool | None) -> None:
    """The row guard: every rank of the CP group holds this row (one all-gather; Note [vlmcp row guard:
    one row per CP group]). Runs after every local check, so a row every rank holds fails on every rank
    before it, and before any other collective."""
    if not (state.check_same_row if check is None else check) or state.group is None or state.cp_size == 1:
        return
    tensors = {"input_ids": row.ids, "labels": row.labels, "cu_seqlens": row.cu, **row.per_token,
               **row.pixels, **row.videos}
    row_guard.check_same_row(tensors, row.ids.numel(), row.cu.numel() - 1, state.group)


def _positions(model: nn.Module, adapter: HFAdapter, row: _Row) -> torch.Tensor:
    """The global row's position ids ``(R, L)``: the model's own rope index per sample, as if it ran alone."""
    rv, ids = row.visuals, row.ids.cpu()
    parts = []
    for s in range(row.cu.numel() - 1):
        a, b = int(row.cu[s]), int(row.cu[s + 1])
        imgs, vids = rv.images_per_sample[s], rv.videos_per_sample[s]
        sub = adapter.select_images(row.pixels, imgs) if row.has_pixels and rv.image_tokens is not None \
            else row.pixels
        extra = {"videos": adapter.select_videos(row.videos, vids)} if vids else {}
        parts.append(adapter.position_ids(model, ids[a:b], rv.types[a:b], sub, **extra).cpu())
    return torch.cat(parts, dim=-1)


def _pad_token(config, adapter: HFAdapter, videos: bool) -> int:
    """The token of padding slots: the model's pad token, never a visual placeholder."""
    pad_id = getattr(config.text_config, "pad_token_id", None)
    placeholders = {adapter.image_token_id(config)}
    if videos:
        placeholders.add(adapter.video_token_id(config))
    if pad_id is None or pad_id in placeholders:
        pad_id = min({0, 1, 2} - placeholders)
    return pad_id


def _local_inputs(model: nn.Module, state, row: _Row, shard: RankShard, positions: torch.Tensor) -> dict:
    """``model(**...)``'s keywords for this rank: its slots of every per-token key, its positions, every
    image and video whole, the ViT's dummy image where needed, and the CP context."""
    adapter = state.adapter
    pad_id = _pad_token(model.config, adapter, bool(row.videos))
    model_inputs: dict[str, Any] = {  # padding slots: the pad token in input_ids, 0 in other token keys
        k: shard.shard(row.per_token[k], fill=pad_id if k == "input_ids" else 0).unsqueeze(0)
        for k in row.keys[InputKind.TOKENS]}
    local_positions = shard.shard(positions, dim=-1, fill=0)
    model_inputs["position_ids"] = adapter.model_position_ids(local_positions).to(row.ids.device)
    model_inputs["use_cache"] = False
    model_inputs.update(row.pixels if row.has_pixels else {})
    model_inputs.update(row.videos)
    dummy = not (row.has_pixels or row.videos) and bool(adapter.vision_modules) and (
        state.dummy_vision or (state.dummy_vision is None and _is_fsdp(model)))
    if dummy:
        model_inputs.update(adapter.dummy_images(model))
    model_inputs[CONTEXT_KEY] = CPContext(shard=shard, group=state.group, backend=state.attention,
                                          dummy_vision=dummy, token_types=row.visuals.types.to(torch.int8),
                                          image_attention=adapter.image_attention)
    return model_inputs


def _local_targets(row: _Row, shard: RankShard, rank: int) -> torch.Tensor:
    """This rank's next-token targets: shifted per sample on the global row, then sharded."""
    ids, visual = row.ids, row.visuals.visual
    targets = row.labels if row.labels is not None else torch.where(visual.to(ids.device), IGNORE_INDEX, ids)
    targets = shift_hf_labels(targets.long(), row.cu.to(targets.device))
    local = shard.shard_labels(targets)
    if rank > 0:  # a replicated slot's target (the last image token predicts the text after it) counts once
        local = local.masked_fill(shard.replicated.to(local.device), IGNORE_INDEX)
    return local
