"""The complete image features on every CP rank of a Hugging Face VLM, in five modes.

Note [vlmcp HF vision placement]
--------------------------------
HF's forward calls the base model's ``get_image_features`` and merges the result at
the image placeholder tokens (``get_placeholder_mask`` + ``masked_scatter``). With every
image token on every rank, that merge works unchanged on the local row; only *who
computes* the features changes with the mode. :func:`place_hf_vision` replaces
``get_image_features`` on the base model (an instance attribute bound to it, so copies
rebind) by :func:`_placed_image_features`, which runs the original ViT call as the
mode says and returns the features of all images, in order, on every rank::

    replicate       original call on every rank                          (SHARE)
    allreduce_hook  original call; hook all-reduces the feature gradient (FULL)
    broadcast       original call on src; vlmcp.comm.broadcast            (SHARE)
    scatter         original call on this rank's images (assign_images, patches^2);
                    vlmcp.comm.all_gather of rows, back to image order    (SHARE)
    hidden_shard    original call with the projector's last Linear cut to this rank's
                    1/P output columns; all_gather on the hidden dim       (ViT SHARE, slice PARTITIONED)

The duals are :mod:`vlmcp.comm`'s (reduce-sum, reduce-scatter), and the parameters
carry the same rules as under :func:`vlmcp.place_vision` (Note [vlmcp gradient rules]),
recorded per vision module so :func:`vlmcp.reduce_gradients` re-applies them. Every
decision reads metadata the CP group shares (image count and grids).

Whole samples (``shard_inputs(..., sample_placement="whole"|"auto")``, Note [vlmcp
whole-sample placement]): a rank's ``input_ids`` then hold only the placeholders of its
own samples' images (and of the split samples' replicated ones), so after the mode has
given every rank all images' features, :func:`_local_features` keeps the rows of the
image tokens this rank holds, in row order (an ``index_select``). Every rank still runs
the mode's collectives on all images, so they match across ranks; the selection's
backward scatters the local rows' gradient into zeros of the full features, so a rank
holding no image token still joins every dual (with a zero gradient)::

    features (all images, every rank) ──index_select(local image slots)──> HF's merge
    whole:  rank 0 [ a a a a | d d ]  takes the rows of a's and d's images
            rank 1 [ b b | c c c ]    takes b's and c's

Text-only rows: HF skips the ViT when there is no ``pixel_values``. Under FSDP or DDP
over DP x CP a replica whose ViT got no gradient while another's did mismatches the
gradient collectives (tested: gloo reports a size mismatch or hangs), so with
``dummy_vision`` ``shard_inputs`` passes one blank image and the call returns
``features[:0] + 0 * features.sum()``: no image token is filled and every ViT
parameter gets an exact zero gradient (verl's and ms-swift's fix).
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

from vlmcp.comm import all_gather, broadcast
from vlmcp.grads import GradRule, grad_tag, set_grad_rule
from vlmcp.hf.adapters import HFAdapter, submodule
from vlmcp.hf.attention import CONTEXT_KEY
from vlmcp.models.merge import image_rows
from vlmcp.vision.assign import assign_images, vit_cost
from vlmcp.vision.placement import VisionMode, _column_slice

__all__ = ["HFVisionPlacement", "VisionTags", "place_hf_vision"]

_ATTR = "_vlmcp_vision"


@dataclass(frozen=True, eq=False)
class VisionTags:
    """Gradient rules of one vision module's parameters, by name (read by ``restore_grad_tags``)."""

    mode: VisionMode
    grad_tags: Mapping = field(default_factory=lambda: MappingProxyType({}))

    def __deepcopy__(self, memo):
        return self


@dataclass(frozen=True, kw_only=True, eq=False)
class HFVisionPlacement:
    """How a placed HF model computes its image features; see Note [vlmcp HF vision placement]."""

    mode: VisionMode
    group: dist.ProcessGroup | None
    src: int
    adapter: HFAdapter
    original: Any
    """The class's ``get_image_features`` (unbound), called with the base model."""
    out_dim: int
    """Width of the features (the LLM hidden size)."""

    def __deepcopy__(self, memo):
        return self  # read-only; a copied model shares the CP group


def _needs_grad(module: nn.Module) -> bool:
    return torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters())


def _placed_image_features(self: nn.Module, *args, **kwargs):
    """Stand-in for ``base_model.get_image_features``: the complete features on every rank."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    pl: HFVisionPlacement = getattr(self, _ATTR)
    ctx = kwargs.pop(CONTEXT_KEY, None)  # the text layout must not reach the ViT
    bound = inspect.signature(pl.original).bind(self, *args, **kwargs)
    call = {}
    for name, value in list(bound.arguments.items())[1:]:
        if bound.signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            call.update(value)
        else:
            call[name] = value
    pixels = {k: call[k] for k in pl.adapter.pixel_keys if call.get(k) is not None}

    def run(sub: Mapping[str, torch.Tensor]) -> torch.Tensor:
        out = pl.original(self, **{**call, **sub})
        feats = out.pooler_output
        return torch.cat(list(feats), 0) if isinstance(feats, (list, tuple)) else feats.flatten(0, -2)

    if ctx is not None and getattr(ctx, "dummy_vision", False):
        f = run(pixels)
        return BaseModelOutputWithPooling(pooler_output=(f[:0] + 0 * f.sum(),))
    tokens = pl.adapter.image_tokens(self, pixels)
    group = pl.group
    world = 1 if group is None else dist.get_world_size(group)
    if pl.mode == "replicate" or world == 1:
        emb = run(pixels)
    elif pl.mode == "allreduce_hook":
        emb = run(pixels)
        if emb.requires_grad:
            emb.register_hook(lambda g: _all_reduce(g, group))
    elif pl.mode == "broadcast":
        if dist.get_rank(group) == pl.src:
            emb = run(pixels)
        else:
            w = _projector_last(self, pl).weight
            emb = w.new_empty(sum(tokens), pl.out_dim).requires_grad_(_needs_grad(self))
        emb = broadcast(emb, pl.src, group)
    elif pl.mode == "scatter":
        emb = _scatter(self, pl, run, pixels, tokens, world)
    else:  # hidden_shard: this rank's columns of every image, gathered on the hidden dim
        emb = run(pixels)
        if world > 1:
            emb = all_gather(emb, group, dim=1)
    if ctx is not None and ctx.shard.plan.sample_placement != "split":
        return BaseModelOutputWithPooling(pooler_output=_local_features(emb, tokens, ctx.shard))
    return BaseModelOutputWithPooling(pooler_output=tuple(emb.split(tokens, 0)))


def _local_features(emb: torch.Tensor, tokens: list[int], shard) -> tuple[torch.Tensor, ...]:
    """The feature rows of the image tokens ``shard`` holds, in local (= row) order, per image.

    Row i of ``emb`` fills the row's i-th image token (HF's merge order), so the local
    image slots' ranks among the row's image tokens index it. Differentiable; at least
    one (possibly empty) tensor, so HF's ``torch.cat`` never gets an empty tuple.
    """
    rows = image_rows(shard)[shard.is_image]  # each local image token's row in emb
    ends = torch.cumsum(torch.as_tensor(tokens, dtype=torch.long), 0)
    image = torch.bucketize(rows, ends, right=True)
    counts = torch.bincount(image, minlength=len(tokens))
    held = counts > 0
    if not bool((counts[held] == torch.as_tensor(tokens, dtype=torch.long)[held]).all()):
        raise RuntimeError("vlmcp: a rank holds part of an image's tokens; whole-sample placement keeps "
                           "every image whole on the ranks that hold it")
    local = emb.index_select(0, rows.to(emb.device))
    split = counts[held].tolist()
    return tuple(local.split(split, 0)) if split else (local,)


def _projector_last(base: nn.Module, pl: HFVisionPlacement) -> nn.Module:
    return submodule(base, pl.adapter.projector_last.removeprefix(pl.adapter.base_model + "."))


def _all_reduce(grad: torch.Tensor, group) -> torch.Tensor:
    grad = grad.clone()  # never reduce in place into a gradient autograd may still hold
    dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=group)
    return grad


def _scatter(base, pl, run, pixels, tokens, world):
    rank = dist.get_rank(pl.group)
    owner = assign_images([vit_cost(t) for t in tokens], world)
    mine = [i for i, o in enumerate(owner) if o == rank]
    rows = [sum(t for t, o in zip(tokens, owner, strict=True) if o == r) for r in range(world)]
    if mine:
        local = run(pl.adapter.select_images(pixels, mine))
    else:  # still joins the gather (and its reduce-scatter in backward)
        w = _projector_last(base, pl).weight
        local = w.new_zeros(0, pl.out_dim)
    if _needs_grad(base) and not local.requires_grad:
        local = local.detach().requires_grad_()
    gathered = all_gather(local, pl.group, dim=0, sizes=rows)  # rank-major
    start, seen = [0] * len(tokens), [sum(rows[:r]) for r in range(world)]
    for i, o in enumerate(owner):
        start[i], seen[o] = seen[o], seen[o] + tokens[i]
    order = torch.cat([torch.arange(s, s + t) for s, t in zip(start, tokens, strict=True)])
    return gathered.index_select(0, order.to(gathered.device))


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
    modules = [submodule(model, p) for p in adapter.vision_modules]
    rule = GradRule.FULL if mode == "allreduce_hook" else GradRule.SHARE
    for m in modules:
        for p in m.parameters():
            set_grad_rule(p, rule, world)
    out_dim = int(model.config.text_config.hidden_size)
    if mode == "hidden_shard" and world > 1:
        parent_path, _, leaf = adapter.projector_last.rpartition(".")
        parent = submodule(model, parent_path)
        rank = dist.get_rank(group)
        setattr(parent, leaf, _column_slice(getattr(parent, leaf), rank, world))
    for m in modules:
        m.placement = VisionTags(mode, MappingProxyType({n: grad_tag(p) for n, p in m.named_parameters()}))
    if not adapter.vision_modules:
        return  # placeholder adapter: replicate, HF's own call
    original = type(base).get_image_features
    setattr(base, _ATTR, HFVisionPlacement(mode=mode, group=group, src=src, adapter=adapter,
                                           original=original, out_dim=out_dim))
    base.get_image_features = types.MethodType(_placed_image_features, base)
