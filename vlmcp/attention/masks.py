"""Mask structure of CP attention: which (query, key) blocks exist, and of what kind.

The mask of a row is causal over sample offsets within each sample and empty across
samples; with bidirectional image attention the tokens of each image also see each
other in both directions. Attention is computed block by block: a :class:`Block`
pairs a contiguous range of stored queries with a contiguous range of stored keys of
the same sample, and :func:`block_kind` says whether the block is empty (skipped),
full, causal (top-left aligned) or needs a dense mask.

Tokens are described by :class:`Run`: a stretch of stored tokens whose offsets in
their sample are consecutive (and, under bidirectional attention, that lies inside
one image or outside every image). Zigzag chunks, replicated images and the gathered
rows of Ulysses are all runs, so the kind of every block follows from a few integers
per block and nothing is materialised as an (L, L) mask. See Note [vlmcp ring
attention schedule] in :mod:`vlmcp.attention.ring` for why the blocks of a zigzag
plan are full, causal or empty.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

import torch

__all__ = ["Block", "MaskKind", "Run", "Segment", "block_kind", "cross_blocks", "dense_mask", "image_runs",
           "runs_of", "sample_runs", "segments", "self_blocks", "windowed"]


class MaskKind(enum.Enum):
    """What a block of (queries, keys) needs from the kernel."""

    EMPTY = "empty"
    """No query sees any key: skip the block."""
    FULL = "full"
    """Every query sees every key: no mask."""
    CAUSAL = "causal"
    """Query i sees keys 0..i (top-left aligned): the kernel's causal path."""
    MASKED = "masked"
    """Anything else: a dense mask built by :func:`dense_mask`."""


class Run(NamedTuple):
    """Stored tokens ``start .. start+length-1`` of one sample, at offsets ``offset ..``.

    ``image`` is the image (row order) every token of the run belongs to, or -1: runs
    are split at image boundaries only where bidirectional attention needs it.
    """

    sample: int
    start: int
    offset: int
    length: int
    image: int = -1


class Block(NamedTuple):
    """Queries ``q_start:q_end`` against keys ``k_start:k_end`` (storage indices).

    ``q_offset``, ``k_offset`` (offsets in the sample of the first query and key) and
    the bidirectional span ``[image_start, image_end)`` (sample offsets of the one image
    whose tokens see each other here; empty under causal attention) define the mask of
    a ``MASKED`` block; ``FULL`` blocks may be coalesced from several runs, and then
    the offsets describe the first one only.
    """

    q_start: int
    q_end: int
    k_start: int
    k_end: int
    kind: MaskKind
    q_offset: int = 0
    k_offset: int = 0
    image_start: int = 0
    image_end: int = 0
    window: int = 0
    """Sliding window (Gemma 3): the query at offset ``x`` also needs ``x - y < window``
    of the key at offset ``y``; 0: no window. Only ``MASKED`` blocks carry one."""


def windowed(block: Block, window: int) -> Block | None:
    """``block`` (offsets exact, not coalesced) under a sliding window of ``window`` keys.

    The mask becomes ``seen(x, y) and x - y < window`` (transformers' Gemma 3
    ``sliding_window_overlay`` ANDed onto causal-or-same-image). Keys before the first
    query's window are cut off; a block left without keys is None (skipped: in the ring,
    a whole step's block may fall outside the window), and a block the window still cuts
    becomes ``MASKED``. The pair ``(q_offset, first kept key)`` is seen, so a kept block
    is never empty.
    """
    if window <= 0:
        return block
    lq, lk = block.q_end - block.q_start, block.k_end - block.k_start
    cut = max(0, block.q_offset - window + 1 - block.k_offset)
    if cut >= lk:
        return None
    block = block._replace(k_start=block.k_start + cut, k_offset=block.k_offset + cut)
    if block.q_offset + lq - 1 - block.k_offset < window:
        return block  # every pair lies inside the window
    return block._replace(kind=MaskKind.MASKED, window=window)


def block_kind(q_offset: int, q_len: int, k_offset: int, k_len: int,
               image_span: tuple[int, int] = (0, 0)) -> MaskKind:
    """The kind of the block between two runs of the same sample.

    Query at offset ``x`` sees key at offset ``y`` iff ``y <= x``, or both lie in the
    bidirectional span ``[a, b)`` (one image's offsets; ``(0, 0)`` for none).

    Args:
        q_offset, q_len: offset of the first query in its sample, and query count.
        k_offset, k_len: the same for the keys.
        image_span: ``(a, b)``, the image span whose tokens see each other.

    Returns:
        The :class:`MaskKind` of the block.
    """
    if q_len <= 0 or k_len <= 0:
        return MaskKind.EMPTY
    a, b = image_span
    q_last, k_last = q_offset + q_len - 1, k_offset + k_len - 1
    if k_last <= q_offset:
        return MaskKind.FULL
    # the pairs above the diagonal (key after query) are all seen iff they all lie in the span
    x_hi = min(q_last, k_last - 1)
    y_lo = max(k_offset, q_offset + 1)
    if a <= q_offset and x_hi < b and a <= y_lo and k_last < b:
        return MaskKind.FULL
    q_in = max(q_offset, a) <= min(q_last, b - 1)  # some query lies in the span
    k_in = max(k_offset, a) <= min(k_last, b - 1)
    if q_last < k_offset and not (q_in and k_in):
        return MaskKind.EMPTY
    # top-left causal: same first offset, and no seen pair above the diagonal inside the span
    if q_offset == k_offset and not (q_in and max(q_offset, a) < min(k_last, b - 1)):
        return MaskKind.CAUSAL
    return MaskKind.MASKED


def dense_mask(block: Block, q_len: int, k_len: int, device=None) -> torch.Tensor:
    """``BoolTensor[q_len, k_len]``, True where the query sees the key (for ``MASKED`` blocks)."""
    qo = torch.arange(q_len, device=device) + block.q_offset
    ko = torch.arange(k_len, device=device) + block.k_offset
    seen = ko[None, :] <= qo[:, None]
    if block.image_end > block.image_start:
        a, b = block.image_start, block.image_end
        seen |= ((qo >= a) & (qo < b))[:, None] & ((ko >= a) & (ko < b))[None, :]
    if block.window > 0:
        seen &= (qo[:, None] - ko[None, :]) < block.window
    return seen


def runs_of(sample_ids: torch.Tensor, offsets: torch.Tensor,
            image_ids: torch.Tensor | None = None) -> list[Run]:
    """Split stored tokens into runs; padding (offset ``-1``) belongs to no run.

    Args:
        sample_ids: ``LongTensor[N]``, sample of each stored token.
        offsets: ``LongTensor[N]``, offset in the sample, ``-1`` for padding.
        image_ids: ``LongTensor[N]`` image of each token (-1: none), to split runs at
            image boundaries (bidirectional attention); None: don't split.
    """
    vi = torch.nonzero(offsets >= 0).flatten()
    if vi.numel() == 0:
        return []
    s, o = sample_ids[vi], offsets[vi]
    im = image_ids[vi] if image_ids is not None else torch.full_like(vi, -1)
    brk = torch.ones(vi.numel(), dtype=torch.bool)
    brk[1:] = (s[1:] != s[:-1]) | (o[1:] != o[:-1] + 1) | (vi[1:] != vi[:-1] + 1) | (im[1:] != im[:-1])
    first = torch.nonzero(brk).flatten()
    lengths = torch.diff(first, append=torch.tensor([vi.numel()]))
    return [Run(int(s[f]), int(vi[f]), int(o[f]), int(n), int(im[f]))
            for f, n in zip(first.tolist(), lengths.tolist(), strict=True)]


def cross_blocks(q_runs: Sequence[Run], k_runs: Sequence[Run],
                 image_spans: Sequence[tuple[int, int]] = (), window: int = 0) -> list[Block]:
    """Non-empty blocks between query runs and key runs, full blocks coalesced.

    Args:
        q_runs, k_runs: runs of the query and key storage (from :func:`runs_of`, split
            at image boundaries under bidirectional attention).
        image_spans: per image (row order), its ``[start, end)`` sample offsets; two runs
            of the same image see each other both ways. Empty under causal attention.
        window: sliding window (:func:`windowed`); 0: none.

    Returns:
        Blocks sorted by query start; adjacent ``FULL`` blocks sharing a query range
        (or a key range) are merged so the kernel sees few, large calls.
    """
    by_sample: dict[int, list[Run]] = {}
    for r in k_runs:
        by_sample.setdefault(r.sample, []).append(r)
    blocks = []
    for q in q_runs:
        for k in by_sample.get(q.sample, ()):
            span = image_spans[q.image] if q.image >= 0 and q.image == k.image and image_spans else (0, 0)
            kind = block_kind(q.offset, q.length, k.offset, k.length, span)
            if kind is not MaskKind.EMPTY:
                b = windowed(Block(q.start, q.start + q.length, k.start, k.start + k.length,
                                   kind, q.offset, k.offset, *span), window)
                if b is not None:
                    blocks.append(b)
    return _coalesce(blocks)


def _coalesce(blocks: list[Block]) -> list[Block]:
    full = [b for b in blocks if b.kind is MaskKind.FULL]
    rest = [b for b in blocks if b.kind is not MaskKind.FULL]
    for key, same, a0, a1 in (((0, 1, 2), (0, 1), 2, 3), ((2, 3, 0), (2, 3), 0, 1)):
        full.sort(key=lambda b, key=key: tuple(b[i] for i in key))
        merged: list[Block] = []
        for b in full:
            m = merged[-1] if merged else None
            if m is not None and all(m[i] == b[i] for i in same) and m[a1] == b[a0]:
                merged[-1] = m._replace(**{m._fields[a1]: b[a1]})
            else:
                merged.append(b)
        full = merged
    return sorted(full + rest, key=lambda b: (b.q_start, b.k_start))


class Segment(NamedTuple):
    """Stored tokens ``start .. start+length-1`` of one sample in increasing offset order.

    ``images``: the ``(a, b)`` storage ranges of the images inside it whose tokens see
    each other (bidirectional attention; empty under causal). ``queries``: the
    storage ranges whose queries are computed (None: all of them).
    """

    start: int
    length: int
    images: tuple[tuple[int, int], ...] = ()
    queries: tuple[tuple[int, int], ...] | None = None


def self_blocks(segments: Sequence[Segment], window: int = 0) -> list[Block]:
    """Blocks of queries against their own keys, for segments stored in offset order.

    Within such a segment "key offset <= query offset" is "key index <= query index",
    so a stretch of queries ``[u, v)`` outside the images sees keys ``[start, u)`` in
    full and itself causally, and the queries of an image ``[a, b)`` see keys
    ``[start, b)`` in full. Under causal attention with every query computed, a
    segment is one causal block, whatever runs it is made of.

    With a sliding ``window`` (:func:`windowed`) the segment must hold its sample's
    offsets contiguously (offset = index - start: Ulysses' gathered row, a rank's
    whole samples); a rank's zigzag chunks use :func:`cross_blocks` instead.

    Returns:
        The blocks, full blocks coalesced (a prefix-LM segment gives two blocks).
    """
    blocks = []
    for seg in segments:
        start, end = seg.start, seg.start + seg.length
        queries = ((start, end),) if seg.queries is None else seg.queries
        for u, v in queries:
            u, v = max(u, start), min(v, end)
            # cut the query range at image boundaries: each piece is text or one image
            cuts = sorted({u, v, *(c for a, b in seg.images for c in (a, b) if u < c < v)})
            for lo, hi in zip(cuts[:-1], cuts[1:], strict=False):
                image = next(((a, b) for a, b in seg.images if a <= lo < b), None)
                if image is not None:
                    span = (image[0] - start, image[1] - start)
                    pieces = [Block(lo, hi, start, image[1], MaskKind.FULL, lo - start, 0, *span)]
                else:
                    pieces = [Block(lo, hi, start, lo, MaskKind.FULL, lo - start, 0)] if lo > start else []
                    pieces.append(Block(lo, hi, lo, hi, MaskKind.CAUSAL, lo - start, lo - start))
                if window > 0:
                    blocks += [w for w in (windowed(b, window) for b in pieces) if w is not None]
                else:  # offsets only matter to a window: full and causal blocks need none
                    blocks += [b._replace(q_offset=0, k_offset=0, image_start=0, image_end=0) for b in pieces]
    return _coalesce(blocks)


def sample_runs(mask: torch.Tensor, sample_ids: torch.Tensor) -> list[tuple[int, int, int]]:
    """``(sample, a, b)`` for each maximal run ``[a, b)`` of True in ``mask`` within one sample."""
    idx = torch.nonzero(mask).flatten()
    if idx.numel() == 0:
        return []
    s = sample_ids[idx]
    brk = torch.ones(idx.numel(), dtype=torch.bool)
    brk[1:] = (idx[1:] != idx[:-1] + 1) | (s[1:] != s[:-1])
    first = torch.nonzero(brk).flatten()
    last = torch.cat([first[1:], first.new_tensor([idx.numel()])]) - 1
    return list(zip(s[first].tolist(), idx[first].tolist(), (idx[last] + 1).tolist(), strict=True))


def image_runs(image_ids: torch.Tensor, image_samples: torch.Tensor) -> list[tuple[int, int, int]]:
    """``(sample, a, b)``: the storage range of each image among stored tokens in global order.

    Args:
        image_ids: ``LongTensor[N]``, the image of each stored token (-1: text or padding);
            an image's stored tokens are contiguous (storage is in global order).
        image_samples: ``LongTensor[n]``, the sample of each image of the row.
    """
    at = torch.nonzero(image_ids >= 0).flatten()
    if at.numel() == 0:
        return []
    ids, counts = torch.unique_consecutive(image_ids[at], return_counts=True)
    first = at[torch.cumsum(counts, 0) - counts]
    return [(int(image_samples[i]), f, f + c)
            for i, f, c in zip(ids.tolist(), first.tolist(), counts.tolist(), strict=True)]


def segments(n_samples: int, starts: Sequence[int], lens: Sequence[int],
             images: Sequence[tuple[int, int, int]] = (),
             queries: Sequence[tuple[int, int, int]] | None = None) -> list[Segment]:
    """One :class:`Segment` per sample from ``(sample, a, b)`` image and query ranges."""
    per_image: list[list[tuple[int, int]]] = [[] for _ in range(n_samples)]
    for s, a, b in images:
        per_image[s].append((a, b))
    per_query: list[list[tuple[int, int]]] | None = None
    if queries is not None:
        per_query = [[] for _ in range(n_samples)]
        for s, a, b in queries:
            per_query[s].append((a, b))
    return [Segment(starts[s], lens[s], tuple(per_image[s]),
                    None if per_query is None else tuple(per_query[s])) for s in range(n_samples)]
