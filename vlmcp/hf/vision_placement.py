"""The complete image and video features on every CP rank of a Hugging Face VLM, in five modes.

Note [vlmcp HF vision placement]
--------------------------------
HF's forward calls the base model's ``get_image_features`` (and ``get_video_features``) and
merges the result at the image (video) placeholder tokens (``get_placeholder_mask`` +
``masked_scatter``). With every visual token on every rank, that merge works unchanged on
the local row; only *who computes* the features changes with the mode. :func:`place_hf_vision`
replaces both calls on the base model (instance attributes bound to it, so copies rebind)
by one code path, :func:`_placed_features`, which hands the original ViT call to the mode
engine, :func:`vlmcp.vision.modes.placed_features` (Note [vlmcp vision placement modes]: the
same five modes, collectives, duals and rules as :func:`vlmcp.place_vision`), and returns the
features of all images (videos), in order, on every rank. Whether the features require grad
(the broadcast receivers' placeholders, an empty scatter part) is read from the vision
modules' parameters alone, so a frozen ViT and projector under a trained LLM run no dual and
no rank waits for one. Such a vision side also runs without autograd (no backward, and no
hook can make its output require grad on one rank only: HF's ``enable_input_require_grads``,
installed by ``gradient_checkpointing_enable``, marks the ViT's patch embedding output, which
made a ``broadcast`` source alone run the dual and hang). A ViT frozen under a trained
projector still runs backward to that patch embedding when the hook is on (exact, only
slower); ``vlmcp train`` removes the hook, which non-reentrant checkpointing does not need.

A ViT unit is what the ViT attends over: an image, or one temporal patch group (frame
group) of a video (Note [vlmcp HF videos: frame groups are visual units]). ``scatter``
balances the units of one call by cost (largest first), so one long video's frame groups
spread over the group and its ViT work falls by about P per rank, while an image is never
cut. Images and videos are two calls (HF makes them), each balanced on its own.

The parameters carry the mode's rules (Note [vlmcp gradient rules]), recorded per vision
module so :func:`vlmcp.reduce_gradients` re-applies them. Every decision reads metadata the
CP group shares (image and video counts and grids).

Qwen3-VL's class ``get_video_features`` calls ``self.get_image_features``, which is the
stand-in: while the original call runs, a nested stand-in call passes straight through to
the class's function (``_BUSY``), so the video's features are placed once, as a video.

Deepstack (Qwen3-VL; the adapter's ``deepstack_output``): the call also returns one
feature list per level (``deepstack_features``), which HF adds at the visual tokens of
early LLM layers (``visual_pos_masks``: the same tokens, in the same order, as the image
and video merges). Every level is a second set of features of the same units, so it follows the
same mode: the wrapper stacks the levels, ``(tokens, levels, D)``, and every step above
(the hook, the broadcast, the row gather, the hidden-dim gather of each level's
``hidden_shard`` slice, the whole-sample selection below) runs once on the stack; the
result is unstacked into ``pooler_output`` and ``deepstack_features`` again. One
collective per mode whatever the level count; ``hidden_shard`` cuts each deepstack
merger's last Linear (``adapter.deepstack_projectors``) like the projector's::

    run(images) -> [ main | level 1 | ... ]  (tokens, 1 + K, D or D/P)
                   ── the mode's collective and dual, once ──> unbind(1), split per image

Whole samples and sharded visual tokens (``shard_inputs(..., sample_placement="whole"|"auto")``,
Note [vlmcp whole-sample placement]; ``image_strategy="shard"``): a rank's ``input_ids`` then
hold only some visual tokens (its own samples' images; under ``shard`` its zigzag chunks of
every split sample, which may cut an image or a frame group anywhere), so after the mode
has given every rank all features, :func:`_local_features` keeps the rows of the tokens of
this kind (image or video, from the row's ``CPContext.token_types``) this rank holds, in row
order (an ``index_select``). Every rank still runs the mode's collectives on all units, so
they match across ranks; the selection's backward scatters the local rows' gradient into
zeros of the full features, so a rank holding no visual token still joins every dual (with
a zero gradient)::

    features (all units, every rank) ──index_select(local slots of this kind)──> HF's merge
    whole:  rank 0 [ a a a a | d d ]        takes the rows of a's and d's images
            rank 1 [ b b | c c c ]          takes b's and c's
    shard:  rank 0 [ t V V | V t ]  rank 1 [ V V t | t ]   each takes its own V rows, in order

The CP context (:class:`~vlmcp.hf.attention.CPContext`: the shard, the dummy flag) reaches
the wrapper in the call's keywords where HF passes ``**kwargs`` on (Qwen-VL, LLaVA); where
it does not (InternVL, LLaVA-OneVision, SmolVLM, Mistral3), a forward pre-hook of the base
model keeps it for the duration of the call.

Text-only rows: HF skips the ViT when there is no ``pixel_values`` (nor videos). Under FSDP or DDP
over DP x CP a replica whose ViT got no gradient while another's did mismatches the
gradient collectives (tested: gloo reports a size mismatch or hangs), so with
``dummy_vision`` ``shard_inputs`` passes one blank image and the call returns zero
rows plus ``0 * features.sum()`` (every level: the sum runs over the stack): no
image token is filled and every ViT parameter, deepstack mergers included, gets an
exact zero gradient (verl's and ms-swift's fix).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.grads import GradRule, grad_tag, set_grad_rule
from vlmcp.hf.adapters import HFAdapter, submodule
from vlmcp.hf.attention import CONTEXT_KEY
from vlmcp.hf.peft import slice_columns
from vlmcp.vision.modes import VisionMode, mode_rule, placed_features

__all__ = ["HFVisionPlacement", "VisionTags", "place_hf_vision"]

_ATTR = "_vlmcp_vision"
_BUSY = "_vlmcp_in_vit"  # set while the original call runs: a nested get_*_features call is passed through
_CALL = "_vlmcp_vision_context"


def _remember_context(module: nn.Module, args, kwargs) -> None:
    """Forward pre-hook of the base model: this call's :class:`CPContext` for the vision wrapper."""
    setattr(module, _CALL, kwargs.get(CONTEXT_KEY))


def _forget_context(module: nn.Module, args, kwargs, output) -> None:
    setattr(module, _CALL, None)


@dataclass(frozen=True, eq=False)
class VisionTags:
    """Gradient rules of one vision module's parameters, by name (read by ``restore_grad_tags``)."""

    mode: VisionMode
    grad_tags: Mapping = field(default_factory=lambda: MappingProxyType({}))
    own_params_only: bool = False
    """The record covers only the named parameters of the module itself (``adapter.vision_params``)."""

    def __deepcopy__(self, memo):
        return self


@dataclass(frozen=True, kw_only=True, eq=False)
class HFVisionPlacement:
    """How a placed HF model computes its image features; see Note [vlmcp HF vision placement]."""

    mode: VisionMode
    group: dist.ProcessGroup | None
    src: int
    adapter: HFAdapter
    originals: Mapping[str, Any]
    """The class's ``get_image_features`` (``"image"``) and ``get_video_features`` (``"video"``, where
    the adapter takes videos), unbound, called with the base model."""
    out_dim: int
    """Width of the features (the LLM hidden size)."""
    levels: int
    """Feature levels: the main features and the adapter's deepstack levels."""
    vision_paths: tuple[str, ...]
    """The model's vision modules (:meth:`HFAdapter.vision_module_paths`), relative to the base model."""

    def __deepcopy__(self, memo):
        return self  # read-only; a copied model shares the CP group


def _placed_image_features(self: nn.Module, *args, **kwargs):
    """Stand-in for ``base_model.get_image_features``: the complete features on every rank."""
    return _placed_features(self, "image", *args, **kwargs)


def _placed_video_features(self: nn.Module, *args, **kwargs):
    """Stand-in for ``base_model.get_video_features``: the complete features on every rank."""
    return _placed_features(self, "video", *args, **kwargs)


def _placed_features(self: nn.Module, modality: str, *args, **kwargs):
    """One code path for images and videos (``modality``); see Note [vlmcp HF vision placement]."""
    pl: HFVisionPlacement = getattr(self, _ATTR)
    original = pl.originals[modality]
    if getattr(self, _BUSY, False):  # the model's own video call runs its image call (Qwen3-VL): as is
        kwargs.pop(CONTEXT_KEY, None)
        return original(self, *args, **kwargs)
    ctx = kwargs.pop(CONTEXT_KEY, None)  # the text layout must not reach the ViT
    if ctx is None:  # a forward that calls get_image_features without **kwargs (InternVL, Mistral3...)
        ctx = getattr(self, _CALL, None)
    bound = inspect.signature(original).bind(self, *args, **kwargs)
    call = {}
    for name, value in list(bound.arguments.items())[1:]:
        if bound.signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            call.update(value)
        else:
            call[name] = value
    adapter = pl.adapter
    keys = adapter.pixel_keys if modality == "image" else adapter.video_pixel_keys
    pixels = {k: call[k] for k in keys if call.get(k) is not None}

    needs = _vision_needs_grad(self, pl)

    def run(sub: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The original call on ``sub``: every level's features stacked, ``(tokens, levels, width)``.

        A vision side with no trainable parameter runs without autograd, so its output never
        requires grad on any rank, whatever hooks make a ViT input require grad (HF's
        ``enable_input_require_grads``, which ``gradient_checkpointing_enable`` installs on
        the ViT's patch embedding too): no rank runs its backward or waits for a dual.
        """
        setattr(self, _BUSY, True)
        try:
            with torch.set_grad_enabled(needs):
                out = original(self, **{**call, **sub})
        finally:
            setattr(self, _BUSY, False)
        levels = [out.pooler_output]
        if adapter.deepstack_output is not None:
            levels += list(getattr(out, adapter.deepstack_output))
        if len(levels) != pl.levels:
            raise RuntimeError(f"vlmcp: {type(self).__name__}.get_{modality}_features returned {len(levels)} "
                               f"feature levels, the adapter expects {pl.levels}")
        flat = [torch.cat(list(f), 0) if isinstance(f, (list, tuple)) else f.flatten(0, -2) for f in levels]
        return flat[0].unsqueeze(1) if len(flat) == 1 else torch.stack(flat, 1)

    if ctx is not None and getattr(ctx, "dummy_vision", False) and modality == "image":
        f = run(pixels)  # (hidden_shard: this rank's columns only; the empty rows are full width)
        return _output(pl, f.new_zeros(0, pl.levels, pl.out_dim) + 0 * f.sum(), [0])
    if modality == "image":
        tokens = adapter.image_tokens(self, pixels)
        units, select = tokens, (lambda index: adapter.select_images(pixels, index))
    else:  # a video's ViT units are its frame groups (Note [vlmcp HF videos: frame groups are visual units])
        tokens = adapter.video_tokens(self, pixels)
        groups = [(v, g, n) for v, (t, n) in enumerate(adapter.frame_groups(self, pixels)) for g in range(t)]
        units = [n for _, _, n in groups]
        select = lambda index: adapter.select_frames(pixels, [groups[i][:2] for i in index])  # noqa: E731
    empty = lambda rows: _projector_last(self, pl).weight.new_empty(rows, pl.levels, pl.out_dim)  # noqa: E731

    def run_units(index):
        if index is None:
            return run(pixels)
        return run(select(index)) if index else empty(0)  # an empty part still joins the gather

    emb = placed_features(pl.mode, pl.group, units, run_units, empty, src=pl.src, requires_grad=needs)
    partial = ctx is not None and (ctx.shard.plan.sample_placement != "split"
                                   or ctx.shard.image_strategy == "shard")
    if partial:  # this rank's input_ids hold only some visual tokens: their rows, in order
        emb, tokens = _local_features(emb, tokens, ctx, 1 if modality == "image" else 2)
    return _output(pl, emb, tokens, modality)


def _output(pl: HFVisionPlacement, emb: torch.Tensor, tokens: list[int], modality: str = "image"):
    """``get_*_features``' output: ``emb (tokens, levels, D)`` unstacked, each level split per image/video
    (or, where the forward flattens one batch of videos, ``(1, tokens, D)``: LLaVA-OneVision)."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    levels = [tuple(f.split(tokens, 0)) for f in emb.unbind(1)]
    main = levels[0] if pl.adapter.features_per_image else emb[:, 0]
    if modality == "video" and pl.adapter.video_features_batched:
        main = emb[:, 0].unsqueeze(0)
    out = BaseModelOutputWithPooling(pooler_output=main)
    if pl.adapter.deepstack_output is not None:
        setattr(out, pl.adapter.deepstack_output, levels[1:])
    return out


def _local_features(emb: torch.Tensor, tokens: list[int], ctx, kind: int) -> tuple[torch.Tensor, list[int]]:
    """The feature rows of the ``kind`` (1 image, 2 video) tokens this rank holds, in local (= row) order,
    and how many each image / video gives.

    Row i of ``emb (tokens, levels, D)`` fills the row's i-th token of that kind (HF's merge
    order), at every level, so the local slots' ranks among the row's tokens of that kind
    index it: whole images (whole samples), or any part of one (``image_strategy="shard"``).
    Differentiable. The counts have at least one (possibly zero) entry, so HF's
    ``torch.cat`` never gets an empty tuple.
    """
    shard = ctx.shard
    types = ctx.token_types
    is_kind = shard.plan.is_image if types is None else (types == kind)
    before = torch.cumsum(is_kind.long(), 0) - 1
    pos = shard.positions
    held = (pos >= 0) & is_kind[pos.clamp(min=0)]
    rows = before[pos[held]]
    local = emb.index_select(0, rows.to(emb.device))
    item = torch.bucketize(rows, torch.cumsum(torch.as_tensor(tokens, dtype=torch.long), 0), right=True)
    counts = torch.bincount(item, minlength=len(tokens))
    return local, (counts[counts > 0].tolist() or [0])


def _projector_last(base: nn.Module, pl: HFVisionPlacement) -> nn.Module:
    return submodule(base, pl.adapter.projector_last.removeprefix(pl.adapter.base_model + "."))


def _vision_needs_grad(base: nn.Module, pl: HFVisionPlacement) -> bool:
    """Whether the vision side's output requires grad, from the vision parameters alone (the same on
    every rank): a frozen ViT and projector under a trained LLM need no dual (no rank waits for one)."""
    prefix = pl.adapter.base_model + "."
    params = [p for path in pl.vision_paths for p in submodule(base, path).parameters()]
    params += [base.get_parameter(path.removeprefix(prefix)) for path in pl.adapter.vision_params]
    return torch.is_grad_enabled() and any(p.requires_grad for p in params)


def _place_vision_params(model: nn.Module, adapter: HFAdapter, mode: VisionMode, group,
                         rule: GradRule) -> None:
    """Tag ``adapter.vision_params`` with ``rule``; under ``hidden_shard`` keep this rank's columns
    (last dim), PARTITIONED like the projector's slice. Recorded on the owning module."""
    world = 1 if group is None else dist.get_world_size(group)
    owners: dict[nn.Module, dict] = {}
    for path in adapter.vision_params:
        parent_path, _, leaf = path.rpartition(".")
        parent = submodule(model, parent_path)
        p = getattr(parent, leaf)
        if mode == "hidden_shard" and world > 1:
            n, rank = p.shape[-1] // world, dist.get_rank(group)
            p = nn.Parameter(p.detach()[..., rank * n:(rank + 1) * n].clone(), requires_grad=p.requires_grad)
            setattr(parent, leaf, p)
            set_grad_rule(p, GradRule.PARTITIONED, world, shard_dim=p.dim() - 1, shard_index=rank)
        else:
            set_grad_rule(p, rule, world)
        owners.setdefault(parent, {})[leaf] = grad_tag(p)
    for parent, tags in owners.items():
        parent.placement = VisionTags(mode, MappingProxyType(tags), own_params_only=True)


def place_hf_vision(model: nn.Module, adapter: HFAdapter, mode: VisionMode,
                    group: dist.ProcessGroup | None, src: int = 0) -> None:
    """Install ``mode`` on ``model`` (in place) and tag the vision parameters.

    Args:
        model: the top-level HF model.
        adapter: its architecture's adapter (must list ``mode`` in ``vision_modes``).
        mode: see Note [vlmcp HF vision placement].
        group: the CP group (None: one process).
        src: ``broadcast``'s source rank within ``group``.
    """
    world = 1 if group is None else dist.get_world_size(group)
    base = submodule(model, adapter.base_model)
    paths = adapter.vision_module_paths(model)
    modules = [submodule(model, p) for p in paths]
    rule = mode_rule(mode)
    for m in modules:
        for p in m.parameters():
            set_grad_rule(p, rule, world)
    out_dim = int(model.config.text_config.hidden_size)
    deepstack = adapter.deepstack_projectors(model)
    if mode == "hidden_shard" and world > 1:
        rank = dist.get_rank(group)
        for path in (adapter.projector_last, *deepstack):
            parent_path, _, leaf = path.rpartition(".")
            parent = submodule(model, parent_path)
            setattr(parent, leaf, slice_columns(getattr(parent, leaf), rank, world))  # LoRA too
    for m in modules:
        m.placement = VisionTags(mode, MappingProxyType({n: grad_tag(p) for n, p in m.named_parameters()}))
    if adapter.vision_params:
        _place_vision_params(model, adapter, mode, group, rule)
    if not adapter.vision_modules:
        return  # placeholder adapter: replicate, HF's own call
    originals = {"image": type(base).get_image_features}
    if adapter.takes_videos:
        originals["video"] = type(base).get_video_features
    setattr(base, _ATTR, HFVisionPlacement(mode=mode, group=group, src=src, adapter=adapter,
                                           originals=MappingProxyType(originals), out_dim=out_dim,
                                           levels=1 + len(deepstack),
                                           vision_paths=tuple(p.removeprefix(adapter.base_model + ".")
                                                              for p in paths)))
    base.get_image_features = types.MethodType(_placed_image_features, base)
    if adapter.takes_videos:
        base.get_video_features = types.MethodType(_placed_video_features, base)
    base.register_forward_pre_hook(_remember_context, with_kwargs=True)
    base.register_forward_hook(_forget_context, with_kwargs=True, always_call=True)
