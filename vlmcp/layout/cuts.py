"""Where each sample's sharded tokens are cut into the 2P zigzag chunks.

Note [vlmcp zigzag cut points: equal chunks or equal causal work]
-----------------------------------------------------------------
A sample's *sharded* tokens (its text under ``image_strategy="replicate"``, all of it
under ``"shard"``) are numbered ``k = 0 .. Z-1`` in row order and cut into 2P chunks;
rank r holds chunks r and 2P-1-r. A sharded query's causal work is its sample
offset + 1, and the offset counts every token before it, images included.

*Equal chunks* (``c = ceil(Z / 2P)``, chunk j = ``[j c, (j+1) c)``): when offsets are
``0 .. Z-1`` (no replicated token in the sample), query k and query Z-1-k together
see Z + 1 keys, so chunks r and 2P-1-r hold the same work on every rank. For Z
divisible by 2P this is exactly megatron-core's ``get_batch_on_this_cp_rank`` order,
and both layouts use it wherever nothing of the sample is replicated and Z divides by
2P (a text-only sample; any sample under ``"shard"``).

*Equal work* (every other sample): a replicated image before the
text shifts the later text offsets up, so the prompt's few cheap queries leave the
rank of chunk 0 idle (plain zigzag: max/mean 1.04-1.06 on chat rows). Pair query k
with query Z-1-k (weight ``w_k + w_{Z-1-k}``) and hand out *bands* of pairs from the
outside in: rank r takes pairs ``[d_r, d_{r+1})``, i.e. front tokens
``[d_r, d_{r+1})`` and the mirrored back tokens; rank P-1 takes the middle::

    k:      0 .......... d_1 ....... d_2  mid  Z-d_2 ....... Z-d_1 .......... Z
    chunk:  |    0        |     1     | 2 | 3 |     4        |      5        |   (P = 3)
    rank:        0              1       2   2        1               0

The cuts ``d_r`` are read off the cumulative pair work, nearest to ``r/P`` of the
total, so each rank's band is within one pair of its share. Rounding errors are
carried from sample to sample (error diffusion over the row: a rank that got a pair
too much in one sample is aimed a pair lower in the next), so a row of many short
samples is balanced as well as one long sample. When offsets are ``0 .. Z-1`` every
pair weighs Z + 1 and the bands are equal chunks again; where Z does not divide by 2P
they split the remainder by work instead of padding the last chunks. Work is always
the causal count (offset + 1): under bidirectional attention with ``"shard"``, an
image query's extra keys are not balanced (the cost model prices them).

*Which rank takes which band.* Equal work is not equal tokens: on a chat sample (a
short prompt, an image, the answer) the outermost pairs hold the prompt's cheap queries,
so band 0 has more tokens than the others (about 1.2% more slots on the busiest rank of
a chat row, at P = 2 to 8, when rank r always took band r). A rank's slots are its own
tokens (a sample's segments need not be equally long on every rank; only the row's total
is padded to the longest rank), so the bands of each cut sample are dealt to the ranks
that hold the fewest tokens so far: the band with the most tokens to the rank with the
fewest (the work carry follows the band to its rank). Over a row of many samples the
token counts even out to within a few slots while every rank keeps its share of the
work; ``vlmcp bench plan`` reports both. Samples cut into equal chunks keep band r on
rank r (megatron-core's order; their bands are equal anyway).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["equal_cuts", "zigzag_cuts"]


def equal_cuts(z: int, cp_size: int) -> np.ndarray:
    """``int64[2P+1]``: cut points of equal chunks ``ceil(z / 2P)`` (the last ones may be short)."""
    c = -(-z // (2 * cp_size))
    return np.minimum(np.arange(2 * cp_size + 1, dtype=np.int64) * c, z)


def _band_cuts(w: np.ndarray, cp_size: int, deficit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Equal-work cut points of one sample, given each band's carried surplus ``deficit`` (P x work
    over fair share, in band order); returns the cuts and each band's work."""
    P, z = cp_size, w.size
    if z == 0:
        return np.zeros(2 * P + 1, dtype=np.int64), np.zeros(P, dtype=np.int64)
    h = z // 2
    cp = np.zeros(h + 1, dtype=np.int64)
    np.cumsum(w[:h] + w[::-1][:h], out=cp[1:])
    total = int(cp[-1]) + (int(w[h]) if z % 2 else 0)
    d = np.zeros(P + 1, dtype=np.int64)
    if h > 0 and P > 1:
        # P * Cp[d_r] aimed at r * total minus the earlier bands' carried surplus, nearest wins
        target = np.arange(1, P, dtype=np.int64) * total - np.cumsum(deficit)[:P - 1]
        pcp = P * cp
        i = np.clip(np.searchsorted(pcp, target), 1, h)
        i -= np.abs(pcp[i - 1] - target) <= np.abs(pcp[i] - target)
        d[1:P] = np.minimum(np.maximum.accumulate(i), h)
    work = np.empty(P, dtype=np.int64)
    work[:-1] = cp[d[1:P]] - cp[d[:P - 1]]
    work[-1] = total - int(cp[d[P - 1]])
    mid = z - h
    return np.concatenate([d[:P], [mid], z - d[:P][::-1]]), work


def _band_tokens(cuts: np.ndarray, cp_size: int) -> np.ndarray:
    """Tokens of each band (chunks j and 2P-1-j) of one sample's cut points."""
    chunk = cuts[1:] - cuts[:-1]
    return chunk[:cp_size] + chunk[cp_size:][::-1]


def _deal(tokens: np.ndarray, held: np.ndarray) -> np.ndarray:
    """The rank of each band: the most tokens to the rank holding fewest. Ranks holding the same
    count keep their own bands (rank r band r where nothing tells them apart: a row's first sample)."""
    bands = np.argsort(-tokens, kind="stable")  # by tokens, most first
    place = np.empty_like(bands)
    place[bands] = np.arange(bands.size)  # where each rank's own band stands in that order
    ranks = np.empty(tokens.size, dtype=np.int64)
    ranks[bands] = np.lexsort((place, held))  # fewest held first; ties in the bands' order
    return ranks


def zigzag_cuts(sharded_lens: torch.Tensor, work: torch.Tensor, balance: torch.Tensor,
                cp_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut points of every sample, and the rank of each band (Note [vlmcp zigzag cut points: equal
    chunks or equal causal work]).

    Args:
        sharded_lens: ``LongTensor[S]``, Z of each sample.
        work: ``LongTensor[sum Z]``, causal work (keys seen) of each sharded token,
            samples concatenated in order.
        balance: ``BoolTensor[S]``, samples cut by equal work (the others: equal chunks).
        cp_size: P.

    Returns:
        ``(cuts, band_ranks)``: ``LongTensor[S, 2P+1]``, chunk j of sample s is its sharded tokens
        ``[cuts[s, j], cuts[s, j+1])``; ``LongTensor[S, P]``, the rank that holds band j (chunks j
        and 2P-1-j) of sample s (``j`` itself where the sample is cut into equal chunks).
    """
    P = cp_size
    zs = sharded_lens.tolist()
    flags = balance.tolist()
    w = work.numpy()
    starts = np.concatenate([[0], np.cumsum(zs)]).astype(np.int64)
    deficit = np.zeros(P, dtype=np.int64)  # per rank: P x work over its fair share so far
    held = np.zeros(P, dtype=np.int64)  # per rank: sharded tokens so far
    identity = np.arange(P, dtype=np.int64)
    out = np.empty((len(zs), 2 * P + 1), dtype=np.int64)
    ranks = np.tile(identity, (len(zs), 1))
    for s, (z, bal) in enumerate(zip(zs, flags, strict=True)):
        ws = w[starts[s]:starts[s + 1]]
        if bal:
            guess = _deal(_band_tokens(_band_cuts(ws, P, deficit)[0], P), held)
            cuts, band_work = _band_cuts(ws, P, deficit[guess])
            ranks[s] = _deal(_band_tokens(cuts, P), held)
            if not np.array_equal(ranks[s], guess):
                cuts, band_work = _band_cuts(ws, P, deficit[ranks[s]])
            out[s] = cuts
            deficit[ranks[s]] += P * band_work - int(band_work.sum())
        else:
            cuts = out[s] = equal_cuts(z, P)
            if z:
                cw = np.concatenate([[0], np.cumsum(ws)])[cuts]
                chunk = cw[1:] - cw[:-1]
                deficit += P * (chunk[:P] + chunk[P:][::-1]) - int(cw[-1])
        held[ranks[s]] += _band_tokens(out[s], P)
    return torch.from_numpy(out), torch.from_numpy(ranks)
