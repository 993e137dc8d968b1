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
image query's extra keys are not balanced (the cost model prices them). Each rank's front and back
chunks have the same length, so token counts stay close; the per-sample slot count
is the largest rank's, and the rest is padding (reported by ``vlmcp bench plan``).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["equal_cuts", "zigzag_cuts"]


def equal_cuts(z: int, cp_size: int) -> np.ndarray:
    """``int64[2P+1]``: cut points of equal chunks ``ceil(z / 2P)`` (the last ones may be short)."""
    c = -(-z // (2 * cp_size))
    return np.minimum(np.arange(2 * cp_size + 1, dtype=np.int64) * c, z)


def _band_cuts(w: np.ndarray, cp_size: int, deficit: np.ndarray) -> np.ndarray:
    """Equal-work cut points of one sample; updates ``deficit`` (P x work over fair share) in place."""
    P, z = cp_size, w.size
    if z == 0:
        return np.zeros(2 * P + 1, dtype=np.int64)
    h = z // 2
    cp = np.zeros(h + 1, dtype=np.int64)
    np.cumsum(w[:h] + w[::-1][:h], out=cp[1:])
    total = int(cp[-1]) + (int(w[h]) if z % 2 else 0)
    d = np.zeros(P + 1, dtype=np.int64)
    if h > 0 and P > 1:
        # P * Cp[d_r] aimed at r * total minus the earlier ranks' carried surplus, nearest wins
        target = np.arange(1, P, dtype=np.int64) * total - np.cumsum(deficit)[:P - 1]
        pcp = P * cp
        i = np.clip(np.searchsorted(pcp, target), 1, h)
        i -= np.abs(pcp[i - 1] - target) <= np.abs(pcp[i] - target)
        d[1:P] = np.minimum(np.maximum.accumulate(i), h)
    work = np.empty(P, dtype=np.int64)
    work[:-1] = cp[d[1:P]] - cp[d[:P - 1]]
    work[-1] = total - int(cp[d[P - 1]])
    deficit += P * work - total
    mid = z - h
    return np.concatenate([d[:P], [mid], z - d[:P][::-1]])


def zigzag_cuts(sharded_lens: torch.Tensor, work: torch.Tensor, balance: torch.Tensor,
                cp_size: int) -> torch.Tensor:
    """Cut points of every sample (Note [vlmcp zigzag cut points: equal chunks or equal causal work]).

    Args:
        sharded_lens: ``LongTensor[S]``, Z of each sample.
        work: ``LongTensor[sum Z]``, causal work (keys seen) of each sharded token,
            samples concatenated in order.
        balance: ``BoolTensor[S]``, samples cut by equal work (the others: equal chunks).
        cp_size: P.

    Returns:
        ``LongTensor[S, 2P+1]``: chunk j of sample s is its sharded tokens
        ``[cuts[s, j], cuts[s, j+1])``.
    """
    P = cp_size
    zs = sharded_lens.tolist()
    flags = balance.tolist()
    w = work.numpy()
    starts = np.concatenate([[0], np.cumsum(zs)]).astype(np.int64)
    deficit = np.zeros(P, dtype=np.int64)
    out = np.empty((len(zs), 2 * P + 1), dtype=np.int64)
    for s, (z, bal) in enumerate(zip(zs, flags, strict=True)):
        if bal:
            out[s] = _band_cuts(w[starts[s]:starts[s + 1]], P, deficit)
        else:
            cuts = out[s] = equal_cuts(z, P)
            if z:
                cw = np.concatenate([[0], np.cumsum(w[starts[s]:starts[s + 1]])])[cuts]
                chunk = cw[1:] - cw[:-1]
                deficit += P * (chunk[:P] + chunk[P:][::-1]) - int(cw[-1])
    return torch.from_numpy(out)
