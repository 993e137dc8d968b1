"""A picture of a CP plan: who holds which token, and who computes which attention row.

Top: the global row, coloured by the rank that owns each token (grey: replicated on
every rank). Middle: one strip per rank, its local slots in local order (rank colour:
text, grey: replicated image, lighter rank colour: sharded image, light grey:
padding). Bottom: the L x L attention mask (causal within each sample, image blocks
bidirectional on request), each visible (query, key) pair coloured by the rank that
computes that query row. Black lines in the strips mark sample boundaries (up to 48).
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on CI machines or cluster nodes
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from vlmcp.layout.plan import CPPlan, TokenKind  # noqa: E402

__all__ = ["draw_plan"]

_REPLICATED = to_rgb("#4d4d4d")
_PAD = to_rgb("#d9d9d9")
_EMPTY = (1.0, 1.0, 1.0)
_REPLICATED_OWNER = -2
# Beyond this many samples, boundary lines would hide the colours they separate.
_MAX_BOUNDARY_LINES = 48


def _rank_colours(cp_size: int) -> np.ndarray:
    cmap = plt.get_cmap("tab10" if cp_size <= 10 else "turbo")
    if cp_size <= 10:
        return np.array([cmap(i)[:3] for i in range(cp_size)])
    return np.array([cmap(i / (cp_size - 1))[:3] for i in range(cp_size)])


def _lighter(rgb: np.ndarray) -> np.ndarray:
    return rgb + (1.0 - rgb) * 0.55


def _global_owner(plan: CPPlan) -> np.ndarray:
    """Per global token: the owning rank, or -2 when every rank holds it."""
    owner = torch.full((plan.seq_len,), -1, dtype=torch.long)
    for shard in plan.shards():
        real = shard.positions >= 0
        pos, rep = shard.positions[real], shard.replicated[real]
        owner[pos[~rep]] = shard.rank
        owner[pos[rep]] = _REPLICATED_OWNER
    return owner.numpy()


def _global_is_image(plan: CPPlan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per global token: is it an image token, its sample, its image (-1 for text)."""
    return plan.is_image.numpy(), plan.images.sample_ids.numpy(), plan.images.image_ids.numpy()


def _token_colours(owner: np.ndarray, is_image: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    colours = ranks[np.clip(owner, 0, None)]
    colours = np.where(is_image[:, None], _lighter(colours), colours)
    return np.where((owner == _REPLICATED_OWNER)[:, None], np.array(_REPLICATED), colours)


def _strip(ax, colours: np.ndarray, bounds, label: str) -> None:
    ax.imshow(colours[None], aspect="auto", interpolation="nearest",
              extent=(0, len(colours), 0, 1))
    if len(bounds) <= _MAX_BOUNDARY_LINES:
        for b in bounds:
            ax.axvline(b, color="black", linewidth=0.8)
    ax.set_yticks([])
    ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)


def _mask_image(plan: CPPlan, owner, image_ids, sid, colours, bidirectional: bool,
                max_pixels: int) -> tuple[np.ndarray, int]:
    """RGB mask, point-sampled down to at most ``max_pixels`` per side (cost R^2, not L^2)."""
    n = plan.seq_len
    res = min(n, max_pixels)
    idx = ((np.arange(res) + 0.5) * n / res).astype(np.int64)
    q, k = idx[:, None], idx[None, :]
    visible = (sid[q] == sid[k]) & (k <= q)
    if bidirectional:  # the tokens of one image see each other
        visible |= (image_ids[q] == image_ids[k]) & (image_ids[q] >= 0)
    row_colour = colours[idx]
    image = np.where(visible[..., None], row_colour[:, None, :], np.array(_EMPTY))
    return image, res


def draw_plan(plan: CPPlan, out_png: str | os.PathLike, image_attention: str = "causal",
              max_mask_pixels: int = 768, title: str | None = None) -> Path:
    """Draw a plan's per-rank layout and its attention mask split between ranks.

    Args:
        plan: from :func:`vlmcp.plan_cp`.
        out_png: the PNG to write (its directory is created).
        image_attention: ``"causal"``, or ``"bidirectional"`` to draw each image's
            tokens seeing each other (prefix-LM).
        max_mask_pixels: the mask is sampled down to at most this many pixels per side,
            so drawing stays fast for long rows.
        title: figure title (default: a summary of the plan).

    Returns:
        ``Path(out_png)``.
    """
    if not isinstance(plan, CPPlan):
        raise TypeError(f"plan must be a CPPlan from vlmcp.plan_cp, got {type(plan).__name__}")
    if image_attention not in ("causal", "bidirectional"):
        raise ValueError(f"image_attention must be 'causal' or 'bidirectional', got {image_attention!r}")
    ranks = _rank_colours(plan.cp_size)
    owner = _global_owner(plan)
    is_image, sid, image_ids = _global_is_image(plan)
    colours = _token_colours(owner, is_image, ranks)
    shards = plan.shards()
    strips = plan.cp_size + 1
    fig = plt.figure(figsize=(10, 0.45 * strips + 7))
    grid = fig.add_gridspec(strips + 1, 1, height_ratios=[0.45] * strips + [6.5], hspace=0.6)
    try:
        _strip(fig.add_subplot(grid[0]), colours, plan.cu_seqlens[1:-1].tolist(), "global row")
        for shard in shards:
            local = np.zeros((shard.num_tokens, 3))
            kinds = shard.kinds.numpy()
            own = ranks[shard.rank]
            local[:] = own
            local[kinds == TokenKind.IMAGE] = _lighter(own)
            local[shard.replicated.numpy()] = _REPLICATED
            local[kinds == TokenKind.PAD] = _PAD
            _strip(fig.add_subplot(grid[1 + shard.rank]), local,
                   shard.cu_seqlens[1:-1].tolist(), f"rank {shard.rank}")
        ax = fig.add_subplot(grid[strips])
        mask, res = _mask_image(plan, owner, image_ids, sid, colours,
                                image_attention == "bidirectional", max_mask_pixels)
        ax.imshow(mask, interpolation="nearest", extent=(0, plan.seq_len, plan.seq_len, 0))
        sampled = "" if res == plan.seq_len else f", sampled to {res}x{res}"
        ax.set_title(f"attention mask ({image_attention} image attention{sampled}): "
                     "query rows coloured by the computing rank", fontsize=9)
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        handles = [Patch(color=ranks[r], label=f"rank {r}") for r in range(plan.cp_size)]
        if bool(plan.replicated_lens.sum()):
            handles.append(Patch(color=_REPLICATED, label="image, on every rank"))
        if plan.image_strategy == "shard" and is_image.any():
            handles.append(Patch(color=_lighter(ranks[0]), label="image (lighter rank colour)"))
        if any(bool(s.is_pad.any()) for s in shards):
            handles.append(Patch(color=_PAD, label="padding"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)
        fig.suptitle(title or f"CP plan: P={plan.cp_size}, L={plan.seq_len}, "
                     f"{plan.num_samples} samples, image_strategy={plan.image_strategy}", fontsize=11)
        out = Path(out_png)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
    finally:
        plt.close(fig)
    return out
