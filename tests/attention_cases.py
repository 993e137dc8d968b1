"""Rank functions of the CP attention tests (module level: spawned ranks import them by name).

Gradients are taken of ``(out * dout).sum()``: ``autograd.grad`` with an explicit
``grad_outputs`` tensor imports sympy on first use (seconds per spawned rank).

Every rank builds the same global tensors from a seed, shards them with the plan,
runs ``cp_attention`` forward and backward, and compares with single-process
attention on the whole row (``reference[shard.positions]``). Replicated image
tokens get a share of their output gradient on every rank (shares sum to 1), so the
global loss is counted once and the *sum* over ranks of their input gradients must
equal the reference gradient (share semantics).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import vlmcp
from tests import rows
from vlmcp.attention import cp_attention, reference_attention
from vlmcp.attention.exchange import ring_bytes_sent

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def make_row(samples, heads, kv_heads, head_dim, seed, v_head_dim=None):
    """A packed row (samples as in :mod:`tests.rows`) with image ids and float64 q, k, v, dout
    (V and dout with ``v_head_dim``, default ``head_dim``: MLA)."""
    is_image, cu, image_ids = rows.make_row(samples)
    L = is_image.numel()
    dv = head_dim if v_head_dim is None else v_head_dim
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(L, heads, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(L, kv_heads, head_dim, generator=g, dtype=torch.float64)
    v = torch.randn(L, kv_heads, dv, generator=g, dtype=torch.float64)
    dout = torch.randn(L, heads, dv, generator=g, dtype=torch.float64)
    return is_image, cu, image_ids, q, k, v, dout


def _reference(q, k, v, dout, is_image, cu, image_ids, image_attention, dtype, window=None):
    """(out, lse, dq, dk, dv) of dense attention on the whole row, computed in ``dtype``."""
    x = [t.detach().to(dtype).clone().requires_grad_() for t in (q, k, v)]
    out, lse = reference_attention(*x, is_image, cu, image_attention, image_ids=image_ids,
                                   sliding_window=window)
    grads = torch.autograd.grad((out * dout.to(dtype)).sum(), x)
    return [t.detach().double() for t in (out, lse, *grads)]


def share_of(rank: int, P: int) -> float:
    """This rank's share of a replicated token's output gradient: 1/2, 1/4, ..., the rest to the
    last rank. Powers of two, so shares are exact in every dtype and sum to exactly 1."""
    return 2.0 ** -(rank + 1) if rank < P - 1 else 2.0 ** -(P - 1)


def _max_err(a, b):
    fin = torch.isfinite(b)
    if not bool((torch.isfinite(a) == fin).all()):
        return float("inf")
    return float((a[fin] - b[fin]).abs().max()) if bool(fin.any()) else 0.0


def run_case(group, samples, strategy, backend, image_attention, kv_heads, dtype_name, seed=0,
             heads=12, head_dim=8, placement="split", ulysses_size=None, v_head_dim=None, kernel=None,
             sliding_window=None):
    """One parity case on this rank; returns max errors of out, lse, dq, dk, dv vs float64.

    Also checks exact zeros at padding (output, gradients) and no NaN anywhere.
    For bfloat16 it also returns, as ``baseline``, the errors of the dense reference
    computed in bfloat16 on the whole row against float64: flash-attention's 2x rule.
    """
    rank, P = dist.get_rank(group), dist.get_world_size(group)
    dtype = DTYPES[dtype_name]
    is_image, cu, ids, q, k, v, dout = make_row(samples, heads, kv_heads, head_dim, seed, v_head_dim)
    if dtype != torch.float64:  # the truth is float64 on the same (rounded) inputs
        q, k, v, dout = (t.to(dtype).double() for t in (q, k, v, dout))
    ref = _reference(q, k, v, dout, is_image, cu, ids, image_attention, torch.float64, sliding_window)
    shard = vlmcp.plan_cp(is_image, P, cu, image_strategy=strategy, image_ids=ids,
                          sample_placement=placement).for_rank(rank)
    pos, pad, rep = shard.positions, shard.positions < 0, shard.replicated
    lq, lk, lv = (shard.shard(t).to(dtype).requires_grad_() for t in (q, k, v))
    ldout = shard.shard(dout).to(dtype)
    ldout[pad] = 1.0  # padding must not leak gradient even with a nonzero dout
    ldout[rep] = ldout[rep] * share_of(rank, P)
    out, lse = cp_attention(lq, lk, lv, shard, group, backend, image_attention, return_lse=True,
                            ulysses_size=ulysses_size, kernel=kernel, sliding_window=sliding_window)
    grads = torch.autograd.grad((out * ldout).sum(), (lq, lk, lv))
    for t in (out, lse, *grads):
        assert not bool(torch.isnan(t).any()), "NaN in CP attention"
    assert bool((out[pad] == 0).all()) and all(bool((g[pad] == 0).all()) for g in grads), "padding leaked"
    assert bool(torch.isneginf(lse[pad]).all()), "lse at padding must be -inf"
    # share semantics: sum replicated-token gradients over the group (float64)
    summed = []
    for g in grads:
        g = g.double()
        r = g[rep].contiguous()
        dist.all_reduce(r, group=group)
        g[rep] = r
        summed.append(g)
    valid = ~pad
    errs = {}
    out = out.detach()
    for name, mine, truth in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *summed), ref, strict=True):
        errs[name] = _max_err(mine.double()[valid], truth[pos[valid]])
    if dtype == torch.bfloat16:
        base = _reference(q, k, v, dout, is_image, cu, ids, image_attention, dtype)
        errs["baseline"] = {n: _max_err(b, t) for n, b, t in
                            zip(("out", "lse", "dq", "dk", "dv"), base, ref, strict=True)}
    return errs


def parity_grid(group, cases):
    """Run many cases in one spawned group; returns ``[(case, errs), ...]``."""
    return [(case, run_case(group, *case)) for case in cases]


def parity_grid_kw(group, cases):
    """:func:`parity_grid` with keyword cases ``{name: value}`` (for :func:`run_case`)."""
    return [(case, run_case(group, **case)) for case in cases]


# ---------------------------------------------------------------- communication accounting

_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce_scatter",
                "reduce_scatter_tensor", "all_to_all", "barrier", "send", "recv", "gather", "scatter",
                "reduce", "all_gather_object", "broadcast_object_list")


_FLAT = {"all_gather_single": "ag", "all_gather_into_tensor": "ag", "reduce_scatter_single": "rs",
         "reduce_scatter_tensor": "rs"}


class CommLog:
    """Patches ``torch.distributed`` so every collective and P2P batch is recorded.

    ``entries``: ``("p2p", [(op, nbytes, peer, dtype), ...])`` per ``batch_isend_irecv``,
    ``("a2a", in_numel, out_numel, dtype)`` per ``all_to_all_single``, ``("ag", in_numel,
    out_numel)`` / ``("rs", in_numel, out_numel)`` per flat all-gather / reduce-scatter, and
    ``("other", name)`` for anything else. With ``groups=True`` the a2a, ag and rs entries
    end with the global ranks of their group (a tuple; P2P entries name their peer already).
    With ``forbid=True`` every call raises.
    """

    def __init__(self, forbid: bool = False, groups: bool = False):
        self.entries, self.forbid, self.groups, self._saved = [], forbid, groups, {}

    def _wrap(self, name, fn):
        def wrapper(*args, **kwargs):
            if self.forbid:
                raise AssertionError(f"communicated ({name}) while it should not")
            if name == "batch_isend_irecv":
                self.entries.append(("p2p", [(op.op.__name__, op.tensor.numel() * op.tensor.element_size(),
                                              op.peer, str(op.tensor.dtype)) for op in args[0]]))
            elif name == "all_to_all_single":
                self.entries.append(("a2a", args[1].numel(), args[0].numel(), str(args[0].dtype),
                                     *self._ranks(kwargs)))
            elif name in _FLAT:
                self.entries.append((_FLAT[name], args[1].numel(), args[0].numel(), *self._ranks(kwargs)))
            else:
                self.entries.append(("other", name))
            return fn(*args, **kwargs)
        return wrapper

    def _ranks(self, kwargs) -> tuple:
        if not self.groups:
            return ()
        group = kwargs.get("group")
        return (tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)),)

    def __enter__(self):
        for name in ("batch_isend_irecv", "all_to_all_single", *_COLLECTIVES, *_FLAT):
            if not hasattr(dist, name) or name in self._saved:
                continue
            self._saved[name] = getattr(dist, name)
            setattr(dist, name, self._wrap(name, self._saved[name]))
        return self

    def __exit__(self, *exc):
        for name, fn in self._saved.items():
            setattr(dist, name, fn)


def comm_volume(group, cases):
    """Forward and backward communication of ``cp_attention`` for each case, plus the plan's text counts.

    Returns ``[(forward_entries, backward_entries, text_tokens_per_rank,
    ring_bytes_sent prediction), ...]``.
    """
    rank, P = dist.get_rank(group), dist.get_world_size(group)
    results = []
    for samples, backend, heads, kv_heads, head_dim in cases:
        is_image, cu, ids, q, k, v, dout = make_row(samples, heads, kv_heads, head_dim, 0)
        plan = vlmcp.plan_cp(is_image, P, cu, image_ids=ids)
        shard = plan.for_rank(rank)
        lq, lk, lv = (shard.shard(t).bfloat16().requires_grad_() for t in (q, k, v))
        with CommLog() as fwd:
            out = cp_attention(lq, lk, lv, shard, group, backend)
        loss = (out * shard.shard(dout).bfloat16()).sum()
        with CommLog() as bwd:
            loss.backward()
        text = [int(plan.for_rank(p).is_text.sum()) for p in range(P)]
        results.append((fwd.entries, bwd.entries, text, ring_bytes_sent(shard, kv_heads, head_dim, 2)))
    return results


def no_comm_at_p1(group):
    """P = 1: both backends, forward and backward, without any communication.

    The loss is ``out.sum()`` (a stride-0 ``dout``); returns the max error of dk vs the reference.
    """
    is_image, cu, _, q, k, v, _ = make_row([(3, 5), (0, 4), "t2 i3 t2"], 4, 2, 8, 0)
    shard = vlmcp.plan_cp(is_image, 1, cu).for_rank(0)
    x = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_dk = torch.autograd.grad(reference_attention(*x, is_image, cu)[0].sum(), x[1])[0]
    valid = shard.positions >= 0
    errs = []
    for backend in ("ring", "ulysses"):
        lq, lk, lv = (shard.shard(t).requires_grad_() for t in (q, k, v))
        with CommLog(forbid=True):
            cp_attention(lq, lk, lv, shard, group, backend).sum().backward()
        errs.append(float((lk.grad[valid] - ref_dk[shard.positions[valid]]).abs().max()))
    return errs


def bad_inputs(group):
    """Each bad call must raise a clear error before any communication; returns (label, type, message)."""
    rank, P = dist.get_rank(group), dist.get_world_size(group)
    is_image, cu, _, q, k, v, _ = make_row([(3, 7), (0, 5)], 4, 2, 8, 0)
    plan = vlmcp.plan_cp(is_image, P, cu)
    shard = plan.for_rank(rank)
    lq, lk, lv = (shard.shard(t) for t in (q, k, v))
    other = vlmcp.plan_cp(is_image, P + 1, cu).for_rank(rank)
    calls = {
        "tokens": lambda: cp_attention(lq[:-1], lk[:-1], lv[:-1], shard, group),
        "gqa": lambda: cp_attention(lq, lk[:, :1].expand(-1, 3, -1), lv[:, :1].expand(-1, 3, -1),
                                    shard, group),
        "dtype": lambda: cp_attention(lq.float(), lk, lv, shard, group),
        "cp_size": lambda: cp_attention(other.shard(q), other.shard(k), other.shard(v), other, group),
        "rank": lambda: cp_attention(lq, lk, lv, plan.for_rank((rank + 1) % P), group),
        "ulysses_heads": lambda: cp_attention(lq[:, :2], lk[:, :1], lv[:, :1], shard, group, "ulysses"),
        "backend": lambda: cp_attention(lq, lk, lv, shard, group, "tree"),
        "image_attention": lambda: cp_attention(lq, lk, lv, shard, group, image_attention="full"),
        "scale": lambda: cp_attention(lq, lk, lv, shard, group, softmax_scale=-1.0),
        "kv_shape": lambda: cp_attention(lq, lk, lv[:, :1], shard, group),  # Dv != D is fine (MLA)
    }
    out = []
    with CommLog(forbid=True):
        for label, call in calls.items():
            try:
                call()
                out.append((label, None, ""))
            except (ValueError, TypeError) as e:
                out.append((label, type(e).__name__, str(e)))
    return out


def ring_comm_guards(group):
    """RingComm refuses misuse, then moves one tensor around the ring."""
    from vlmcp.attention.ring_comm import RingComm

    rank, P = dist.get_rank(group), dist.get_world_size(group)
    comm = RingComm(group)
    raised = []
    for label, call in (("wait", comm.wait), ("commit", comm.commit)):
        try:
            call()
        except RuntimeError as e:
            raised.append((label, str(e)))
    got = comm.send_recv(torch.tensor([float(rank)]), torch.empty(1))
    comm.commit()
    try:
        comm.send_recv(torch.zeros(1), torch.empty(1))
    except RuntimeError as e:
        raised.append(("in_flight", str(e)))
    comm.wait()
    return raised, int(got), (rank - 1) % P
