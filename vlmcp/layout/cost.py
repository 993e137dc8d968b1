"""The cost model behind ``plan_cp(..., image_strategy="auto")``: replicate or shard image tokens.

Note [vlmcp cost model: replicate or shard image tokens]
--------------------------------------------------------
Per transformer layer, forward + backward, rank r of a layout costs (in FLOPs)::

    cost_r = flops_per_pair  * pairs_r     attended (query, key) pairs (as in work.py)
           + flops_per_token * tokens_r    local slots, padding included: norms, QKV/O, MLP
           + flops_per_byte  * bytes_r     ring bytes rank r sends: K/V forward; K/V and
                                           dK/dV backward (as ring_bytes_sent counts them)

and a layout costs what its busiest rank costs (every ring step waits for the slowest
rank). Every layer repeats the same layout, so one layer ranks the whole step.

Where the default weights come from (a decoder layer of width d, a SwiGLU MLP of width
m*d, K/V of width d_kv = kv_heads * head_dim; 2 FLOPs per multiply-add)::

    forward, per token:  Q, O projections 2*2*d*d, K, V 2*2*d*d_kv, MLP 3*2*m*d*d
                         = (4 + 6m) d^2 + 4 d d_kv          ((8 + 6m) d^2 without GQA)
    forward, per pair:   Q.K 2d, P.V 2d = 4d
    backward:            2x forward for a matmul (dX and dW)       -> token weight 3x forward
                         flash attention recomputes Q.K, then 4 more products
                                                                   -> pair weight 3.5x = 14d
    per byte:            achieved FLOP/s / link bytes/s = 400 TFLOP/s / 100 GB/s = 4000
                         (an H100-class GPU at ~40% of its bf16 peak, one ring link),
                         as if no transfer overlapped compute. The ring does overlap
                         them, so this overstates communication: a bias toward replicate.

So with d = 4096, m = 3.5, 8 K/V heads of 128 (Llama-3-8B's LLM) one local token
costs 78 d^2 = 1.31 GFLOP, as much as ~23,000 attended pairs (57,344 FLOPs each).

Which layout wins. For a sample of I image and T text tokens with no padding (I and T
multiples of 2P) and causal attention, the busiest ranks differ by::

    replicate - shard = I (P-1)/P * [ flops_per_token + (I+1)/2 * flops_per_pair - B * flops_per_byte ]
                                      ^ image tokens'     ^ image queries'          ^ image K/V the
                                        token work          attention, repeated       ring no longer
                                        on every rank       on every rank             carries

where B = 2 * (2 d_kv itemsize) + 2 d_kv grad_itemsize is what one travelling token
costs a rank per ring step. T cancels: the text is laid out the same way in both
layouts. So the choice turns on the image size per sample and on the
compute/communication ratio, not on how much text there is. With images anywhere in a
sample, an image after text also sees that text, and under ``replicate`` every rank
repeats those pairs too (Note [vlmcp ring attention schedule]); the estimate counts
them exactly from the plan's per-token owners (on chat rows they are well under 1% of
the pairs: ``vlmcp bench plan``). (Under bidirectional image
attention an image query sees all I image keys wherever it sits, so the zigzag no
longer balances ``shard`` exactly and T enters through that imbalance; the estimate
counts every rank's pairs, so it prices this too.)

With the defaults B * flops_per_byte = 16 KiB * 4000 = 6.6e7 FLOPs against 1.31e9 for
one token's own work: sending an image token's K/V around the ring is ~20x cheaper than
repeating its layer on every rank, and ``auto`` shards any sample with an image once
P > 1. Replicate wins where communication is dear against compute (narrow models, wide
K/V, float32, slow links) and the image is small:
I + 1 < 2 (B * flops_per_byte - flops_per_token) / flops_per_pair. Padding moves these
numbers by a few tokens, and the estimate counts it exactly.

The estimate is a pure function of the row's metadata (``cu_seqlens``, each sample's
image length, P) in integer arithmetic, then a few float products in a fixed order, so
every rank that plans the same row with the same :class:`CostModel` picks the same
layout, bit for bit: no rank can wait on a collective its peers skip. The cost model
must therefore be identical on every rank: build it from configuration, never from a
per-rank measurement (a local bandwidth probe, free memory), or ranks may disagree and
hang. Out of scope: the vision tower (the same in both layouts), kernel efficiency, and
Ulysses' all-to-all, which is priced as if it were the ring (Ulysses sends q, k, v and
the output once instead of K/V P-1 times, so its true cost differs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import get_args

import torch

from vlmcp.layout.plan import CPPlan
from vlmcp.layout.work import ImageAttention, attended_pairs

__all__ = ["CostEstimate", "CostModel", "estimate_cost"]

DEFAULT_HIDDEN_SIZE = 4096
DEFAULT_MLP_RATIO = 3.5
DEFAULT_FLOPS_PER_BYTE = 4000.0


def _layer_flops(hidden_size: int, mlp_ratio: float, kv_size: int) -> tuple[float, float]:
    """``(per pair, per token)`` FLOPs of one layer, forward + backward (see the Note)."""
    d = hidden_size
    per_token_fwd = (4 + 6 * mlp_ratio) * d * d + 4 * d * kv_size
    return 3.5 * 4 * d, 3.0 * per_token_fwd


_DEFAULT_PAIR, _DEFAULT_TOKEN = _layer_flops(DEFAULT_HIDDEN_SIZE, DEFAULT_MLP_RATIO, 8 * 128)


def _is_real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Weights that price one layout's busiest rank, per transformer layer, forward + backward.

    See Note [vlmcp cost model: replicate or shard image tokens]. The defaults describe
    Llama-3-8B's LLM (``CostModel.for_transformer(hidden_size=4096)``); build one for
    your model with :meth:`for_transformer`. Only ratios between the weights matter.
    """

    flops_per_pair: float = _DEFAULT_PAIR
    """Cost of one attended (query, key) pair: 14 * hidden_size (Q.K and P.V, forward
    and flash backward)."""

    flops_per_token: float = _DEFAULT_TOKEN
    """Cost of one local slot's token-wise work (norms, Q/K/V/O projections, MLP), which
    every rank repeats for the image tokens ``replicate`` puts on all of them."""

    flops_per_byte: float = DEFAULT_FLOPS_PER_BYTE
    """Cost of sending one byte: the FLOPs a rank could have done meanwhile (achieved
    FLOP/s over link bytes/s), or less where transfers hide behind compute."""

    kv_heads: int = 8
    """K/V heads, for the ring's bytes."""

    head_dim: int = 128
    """Head size, for the ring's bytes."""

    itemsize: int = 2
    """Bytes per K/V element (2 for bfloat16); dK/dV travel in ``max(itemsize, 4)``."""

    image_attention: ImageAttention = "causal"
    """The LLM's mask over image tokens: ``"causal"`` or ``"bidirectional"`` within the image."""

    max_local_tokens: int | None = None
    """Activation-memory budget: local slots per rank a layout may hold (saved activations
    grow with them). A layout over it is chosen only if both are; None: no budget."""

    def __post_init__(self) -> None:
        weights = {"flops_per_pair": self.flops_per_pair, "flops_per_token": self.flops_per_token,
                   "flops_per_byte": self.flops_per_byte}
        for name, w in weights.items():
            if not _is_real(w) or w < 0:
                raise ValueError(f"CostModel.{name} must be a finite number >= 0, got {w!r}")
        if not any(weights.values()):
            raise ValueError(f"CostModel needs at least one positive weight, got {weights}")
        for name in ("kv_heads", "head_dim"):
            if not _is_count(getattr(self, name)):
                raise ValueError(f"CostModel.{name} must be an int >= 1, got {getattr(self, name)!r}")
        if not _is_count(self.itemsize) or self.itemsize not in (1, 2, 4, 8):
            raise ValueError(f"CostModel.itemsize must be 1, 2, 4 or 8 bytes, got {self.itemsize!r}")
        if self.image_attention not in get_args(ImageAttention):
            raise ValueError(f"CostModel.image_attention must be one of {get_args(ImageAttention)}, "
                             f"got {self.image_attention!r}")
        if self.max_local_tokens is not None and not _is_count(self.max_local_tokens):
            raise ValueError(
                f"CostModel.max_local_tokens must be None or an int >= 1, got {self.max_local_tokens!r}")

    @classmethod
    def for_transformer(
        cls,
        *,
        hidden_size: int,
        mlp_ratio: float = DEFAULT_MLP_RATIO,
        kv_heads: int = 8,
        head_dim: int = 128,
        itemsize: int = 2,
        flops_per_byte: float = DEFAULT_FLOPS_PER_BYTE,
        image_attention: ImageAttention = "causal",
        max_local_tokens: int | None = None,
    ) -> CostModel:
        """The weights of a decoder layer of width ``hidden_size`` (see the Note).

        Args:
            hidden_size: d, the LLM's width (the query width ``heads * head_dim``).
            mlp_ratio: intermediate size / d of a SwiGLU MLP (3 matrices); for a
                2-matrix MLP pass 2/3 of its ratio.
            kv_heads, head_dim: K/V width ``kv_heads * head_dim`` (GQA), also the ring's bytes.
            itemsize, flops_per_byte, image_attention, max_local_tokens: as the fields.
        """
        if not _is_count(hidden_size):
            raise ValueError(f"hidden_size must be an int >= 1, got {hidden_size!r}")
        if not _is_real(mlp_ratio) or mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio must be a finite number > 0, got {mlp_ratio!r}")
        if not _is_count(kv_heads) or not _is_count(head_dim):
            raise ValueError(f"kv_heads and head_dim must be ints >= 1, got {kv_heads!r}, {head_dim!r}")
        pair, token = _layer_flops(hidden_size, mlp_ratio, kv_heads * head_dim)
        return cls(flops_per_pair=pair, flops_per_token=token, flops_per_byte=flops_per_byte,
                   kv_heads=kv_heads, head_dim=head_dim, itemsize=itemsize,
                   image_attention=image_attention, max_local_tokens=max_local_tokens)

    @property
    def bytes_per_ring_token(self) -> int:
        """B: bytes one travelling token costs its sender per ring step, forward + backward."""
        kv = 2 * self.kv_heads * self.head_dim
        return 2 * kv * self.itemsize + kv * max(self.itemsize, 4)


@dataclass(frozen=True)
class CostEstimate:
    """One layout's busiest rank as the cost model sees it, per layer, forward + backward.

    Attributes:
        image_strategy: the layout, ``"replicate"`` or ``"shard"``.
        busiest_rank: the rank with the highest cost (the lowest such rank on a tie).
        local_tokens: local slots per rank, padding included (the same on every rank).
        pairs: attended (query, key) pairs of the busiest rank.
        bytes_sent: ring bytes the busiest rank sends, forward + backward.
        attention_flops: ``flops_per_pair * pairs``.
        token_flops: ``flops_per_token * local_tokens``.
        comm_flops: ``flops_per_byte * bytes_sent``.
        fits: ``local_tokens`` is within the model's ``max_local_tokens``.
    """

    image_strategy: str
    busiest_rank: int
    local_tokens: int
    pairs: int
    bytes_sent: int
    attention_flops: float
    token_flops: float
    comm_flops: float
    fits: bool

    @property
    def cost(self) -> float:
        """The busiest rank's cost in FLOPs: attention + token-wise + communication."""
        return self.attention_flops + self.token_flops + self.comm_flops


def estimate_cost(plan: CPPlan, cost_model: CostModel | None = None) -> CostEstimate:
    """Price ``plan``'s busiest rank (see Note [vlmcp cost model: replicate or shard image tokens]).

    Computed from the plan's per-token owners in O(L), without building any rank's
    shard; the pairs are :func:`~vlmcp.layout.work.attended_pairs`' and the bytes
    equal ``vlmcp.attention.exchange.ring_bytes_sent`` summed over both directions.
    """
    model = CostModel() if cost_model is None else cost_model
    if not isinstance(model, CostModel):
        raise TypeError(f"cost_model must be a CostModel, got {type(model).__name__}")
    P = plan.cp_size
    pairs = attended_pairs(plan, model.image_attention).total_pairs
    travelling = torch.bincount(plan.owner[plan.travelling], minlength=P)
    local_tokens = plan.num_slots
    fits = model.max_local_tokens is None or local_tokens <= model.max_local_tokens
    kv = 2 * model.kv_heads * model.head_dim
    total = int(travelling.sum())
    busiest = None
    for r in range(P):
        # ring step s passes on rank (r - s)'s K/V: steps 0..P-2 forward, 1..P-1 for dK/dV
        fwd = (total - int(travelling[(r + 1) % P])) * kv * model.itemsize
        dkv = (total - int(travelling[r])) * kv * max(model.itemsize, 4)
        sent = 2 * fwd + dkv
        est = CostEstimate(
            image_strategy=plan.image_strategy, busiest_rank=r, local_tokens=local_tokens,
            pairs=int(pairs[r]), bytes_sent=sent,
            attention_flops=float(model.flops_per_pair) * int(pairs[r]),
            token_flops=float(model.flops_per_token) * local_tokens,
            comm_flops=float(model.flops_per_byte) * sent, fits=fits)
        if busiest is None or est.cost > busiest.cost:
            busiest = est
    return busiest
