"""Rank functions for the collective, vision placement and gradient tests.

Every function runs a whole grid inside one spawned group (spawning is the slow
part), asserts on the rank, and returns plain data for the test to check again.
Single-process references are computed on each rank from the same seeds.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from vlmcp import comm, plan_cp
from vlmcp.grads import (
    GradRule,
    ddp_ignored_params,
    finish_ddp_gradients,
    grad_rule,
    local_part,
    reduce_gradients,
    set_grad_rule,
)
from vlmcp.loss import cp_cross_entropy
from vlmcp.testing import run_on_ranks
from vlmcp.vision import (
    VisionConfig,
    VisionEncoder,
    assign_images,
    check_images_match,
    place_vision,
    vit_cost,
)

MODES = ("replicate", "broadcast", "scatter", "hidden_shard", "allreduce_hook")
VCFG = dict(out_dim=12, patch_size=2, width=16, depth=2, heads=2, mlp_hidden=16, projector_hidden=16)
# Image sets as (H, W) in pixels, patch 2: 6, 1, 6 and 4 tokens; one image (ranks
# without an image under scatter); no image at all.
IMAGE_SETS = {"four": [(4, 6), (2, 2), (6, 4), (4, 4)], "one": [(2, 4)], "none": []}
NUM_TEXT, VOCAB = 7, 5
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def randn(seed, *shape, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def rel_err(got, ref):
    got = torch.zeros_like(ref) if got is None else got
    n = ref.norm().item()
    return (got - ref).norm().item() / n if n > 0 else (0.0 if not bool(got.any()) else float("inf"))


# --------------------------------------------------------------------------- collectives

def collectives_grid(group):
    """Each autograd collective against a single-process simulation, float64, forward and backward."""
    P, r = dist.get_world_size(group), dist.get_rank(group)
    checked = []

    def leaves(shapes, base):
        return [randn(base + s, *shp).requires_grad_() for s, shp in enumerate(shapes)]

    def compare(name, out, ref_out, x, ref_x, x_before):
        assert torch.equal(x.detach(), x_before), f"{name}: input modified in place"
        assert rel_err(out.detach(), ref_out.detach()) < 1e-14, name
        assert rel_err(x.grad, ref_x.grad) < 1e-12, (name, x.grad, ref_x.grad)
        checked.append(name)

    # broadcast <-> reduce-sum to src: rank s's loss is <w_s, out>.
    for src in range(P):
        xs = leaves([(4, 3)] * P, 10)
        x = randn(10 + r, 4, 3).requires_grad_()
        before = x.detach().clone()
        out = comm.broadcast(x, src, group)
        (out * randn(50 + r, 4, 3)).sum().backward()
        sum((xs[src] * randn(50 + s, 4, 3)).sum() for s in range(P)).backward()
        if r == src:
            compare(f"broadcast src={src}", out, xs[src], x, xs[r], before)
        else:
            assert x.grad is None, "broadcast: a non-source rank received a gradient"
            assert torch.equal(out.detach(), xs[src].detach()) and torch.equal(x.detach(), before)
            checked.append(f"broadcast src={src}")

    # all_gather (uneven, a rank with no rows) <-> reduce-scatter; loss_s = sum(w_s * out^2).
    for dim in (0, 1):
        for sizes in ([2, 0, 3, 1][:P], [0] * P, None):
            n = [2] * P if sizes is None else sizes
            shapes = [(k, 5) if dim == 0 else (4, k) for k in n]
            xs = leaves(shapes, 20)
            x = randn(20 + r, *shapes[r]).requires_grad_()
            before = x.detach().clone()
            out = comm.all_gather(x, group, dim=dim, sizes=sizes)
            ref = torch.cat(xs, dim)
            (randn(60 + r, *out.shape) * out**2).sum().backward()
            sum((randn(60 + s, *ref.shape) * ref**2).sum() for s in range(P)).backward()
            compare(f"all_gather dim={dim} sizes={sizes}", out, ref, x, xs[r], before)

    # copy_to_group (identity) <-> all-reduce-sum: the same x, a different loss per rank.
    x, xr = randn(7, 3, 4).requires_grad_(), randn(7, 3, 4).requires_grad_()
    before = x.detach().clone()
    out = comm.copy_to_group(x, group)
    (randn(70 + r, 3, 4) * out**3).sum().backward()
    sum((randn(70 + s, 3, 4) * xr**3).sum() for s in range(P)).backward()
    compare("copy_to_group", out, xr, x, xr, before)

    # all_reduce_sum <-> identity: the sum feeds a replicated loss counted once.
    xs = leaves([(3, 4)] * P, 80)
    x = randn(80 + r, 3, 4).requires_grad_()
    before = x.detach().clone()
    out = comm.all_reduce_sum(x, group)
    (randn(90, 3, 4) * out**2).sum().backward()
    ref = sum(xs)
    (randn(90, 3, 4) * ref**2).sum().backward()
    compare("all_reduce_sum", out, ref, x, xs[r], before)

    # all_to_all <-> inverse all_to_all, sequence <-> head sharding both ways.
    for scatter_dim, gather_dim in ((0, 1), (1, 0), (2, 2)):
        shape = [2 * P, 3, P * 2]
        xs = leaves([shape] * P, 100)
        x = randn(100 + r, *shape).requires_grad_()
        before = x.detach().clone()
        out = comm.all_to_all(x, group, scatter_dim=scatter_dim, gather_dim=gather_dim)
        outs = [torch.cat([torch.chunk(xs[s], P, scatter_dim)[d] for s in range(P)], gather_dim)
                for d in range(P)]
        (randn(120 + r, *out.shape) * out**2).sum().backward()
        sum((randn(120 + d, *outs[d].shape) * outs[d]**2).sum() for d in range(P)).backward()
        compare(f"all_to_all {scatter_dim}->{gather_dim}", out, outs[r], x, xs[r], before)
    return checked


# --------------------------------------------------------------------------- counting

_COUNTED = ("broadcast", "reduce", "all_reduce", "all_gather_single", "all_gather_into_tensor",
            "reduce_scatter_single", "reduce_scatter_tensor", "all_to_all_single")
_SHORT = {"all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
          "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
          "all_to_all_single": "all_to_all"}


@contextlib.contextmanager
def count_collectives():
    """Record ``(name, input bytes)`` of every outermost torch.distributed collective."""
    calls, depth = [], [0]

    def wrap(name, fn):
        @functools.wraps(fn)
        def counted(*args, **kwargs):
            if depth[0] == 0:
                t = args[1] if name in _SHORT else args[0]  # flat collectives: (out, input)
                calls.append((_SHORT.get(name, name), t.numel() * t.element_size()))
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
        return counted

    saved = {n: getattr(dist, n) for n in _COUNTED if hasattr(dist, n)}
    for n, fn in saved.items():
        setattr(dist, n, wrap(n, fn))
    try:
        yield calls
    finally:
        for n, fn in saved.items():
            setattr(dist, n, fn)


# --------------------------------------------------------------------------- the toy VLM

def make_encoder(dtype, seed=0):
    torch.manual_seed(seed)
    return VisionEncoder(VisionConfig(**VCFG)).to(dtype)


def make_images(sizes, dtype, seed):
    return [randn(seed + i, 3, h, w, dtype=dtype) for i, (h, w) in enumerate(sizes)]


class ToyHead(nn.Module):
    """Stands in for the LLM: text token t reads every image row (like attention) and its own
    embedding; each rank holds a subset of the text, as its CP text shard would."""

    def __init__(self, num_image_tokens, dtype, seed):
        super().__init__()
        d = VCFG["out_dim"]
        self.register_buffer("mix", randn(seed, NUM_TEXT, num_image_tokens, dtype=dtype) * 0.3)
        # Parameters do not depend on the batch: data-parallel replicas share them.
        self.text = nn.Parameter(randn(1001, NUM_TEXT, d, dtype=dtype))
        self.out = nn.Parameter(randn(1002, d, VOCAB, dtype=dtype))

    def forward(self, emb, idx):
        return torch.tanh(self.mix[idx] @ emb + self.text[idx]) @ self.out


def make_labels(seed):
    labels = torch.randint(0, VOCAB, (NUM_TEXT,), generator=torch.Generator().manual_seed(seed))
    labels[[1, 4]] = -100
    return labels


def build(dtype, sizes, seed, mode=None, group=None):
    """(model, images, labels); the model placed on ``group`` when ``mode`` is given."""
    images = make_images(sizes, dtype, seed)
    enc = make_encoder(dtype)
    if mode is not None:
        place_vision(enc, mode=mode, group=group)
    n_tokens = sum((h // 2) * (w // 2) for h, w in sizes)
    return nn.ModuleDict(dict(vision=enc, head=ToyHead(n_tokens, dtype, seed + 7))), images, make_labels(seed)


def reference(dtype, sizes, seed):
    """Single process: loss and gradients of the whole row."""
    model, images, labels = build(dtype, sizes, seed)
    emb = model["vision"](images)
    loss = F.cross_entropy(model["head"](emb, torch.arange(NUM_TEXT)), labels, ignore_index=-100)
    loss.backward()
    return model, emb.detach(), loss.detach()


def cp_step(model, images, labels, group, loss_scale=1.0):
    """One CP forward/backward; rank r holds text tokens r, r+P, ... (maybe none)."""
    P, r = dist.get_world_size(group), dist.get_rank(group)
    idx = torch.arange(NUM_TEXT)[r::P]
    emb = model["vision"](images)
    out = cp_cross_entropy(model["head"](emb, idx), labels[idx], group)
    (out.loss * loss_scale).backward()
    return emb.detach(), out


def ref_grads(*ref_models):
    """name -> gradient averaged over the given single-process models (None counts as 0)."""
    out = {}
    for name, p in ref_models[0].named_parameters():
        gs = [dict(m.named_parameters())[name].grad for m in ref_models]
        out[name] = sum(torch.zeros_like(p) if g is None else g for g in gs) / len(gs)
    return out


def grad_errors(model, ref):
    """Max relative gradient error over the vision parameters and over the head."""
    errs = {"vision": 0.0, "head": 0.0}
    for name, p in model.named_parameters():
        key = "vision" if name.startswith("vision") else "head"
        errs[key] = max(errs[key], rel_err(p.grad, local_part(p, ref[name])))
    return errs


def _simulate_ddp(model, world_group):
    """What torch DDP over DP x CP does: average every (not ignored) gradient over all ranks."""
    ignored = set(ddp_ignored_params(model))
    world = dist.get_world_size(world_group)
    for name, p in model.named_parameters():
        if name not in ignored:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            dist.all_reduce(g, group=world_group)
            p.grad = g / world


def placement_grid(group):
    """Every mode x dtype x image set at this P: forward, loss, gradients, collectives, DDP."""
    P, r = dist.get_world_size(group), dist.get_rank(group)
    results = []
    for dtype in (torch.float64, torch.float32):
        for set_name, sizes in IMAGE_SETS.items():
            ref_model, ref_emb, ref_loss = reference(dtype, sizes, seed=3)
            if sizes:
                assert all(p.grad is not None and p.grad.norm() > 0
                           for p in ref_model["vision"].parameters()), "reference vision grads vanish"
            for mode in MODES:
                model, images, labels = build(dtype, sizes, 3, mode, group)
                with count_collectives() as calls:
                    emb, out = cp_step(model, images, labels, group)
                naive_ratio = _naive_sum_ratio(model, ref_model, group) if sizes else None
                with count_collectives() as reduce_calls:
                    report = reduce_gradients(model, group)
                errs = grad_errors(model, ref_grads(ref_model))
                tol = TOL[dtype]
                assert rel_err(emb, ref_emb) < tol, (mode, set_name, "embeddings")
                assert abs(out.mean.item() - ref_loss.item()) <= tol * abs(ref_loss.item()), (mode, "mean")
                assert errs["vision"] <= tol and errs["head"] <= tol, (mode, dtype, set_name, errs)

                # The other convention: DDP averages over the group, loss scaled by P.
                ddp_model, images, labels = build(dtype, sizes, 3, mode, group)
                cp_step(ddp_model, images, labels, group, loss_scale=P)
                _simulate_ddp(ddp_model, group)
                finish_ddp_gradients(ddp_model, group)
                ddp_errs = grad_errors(ddp_model, ref_grads(ref_model))
                assert max(ddp_errs.values()) <= tol, (mode, dtype, set_name, "ddp", ddp_errs)

                owner = assign_images([vit_cost((h // 2) * (w // 2)) for h, w in sizes], P)
                results.append(dict(
                    mode=mode, dtype=str(dtype), images=set_name, errors=errs, ddp_errors=ddp_errs,
                    calls=calls, reduce_calls=reduce_calls, report=report, naive_ratio=naive_ratio,
                    own_images=sum(o == r for o in owner),
                    n_tokens=sum((h // 2) * (w // 2) for h, w in sizes),
                    max_rows=max([sum(t for t, o in zip([(h // 2) * (w // 2) for h, w in sizes], owner,
                                                        strict=True) if o == q) for q in range(P)]),
                    grad_numel={rule.value: sum(p.numel() for p in model.parameters() if grad_rule(p) is rule)
                                for rule in GradRule},
                    reduced_params=sum(1 for p in model.parameters()
                                       if grad_rule(p) is not GradRule.PARTITIONED),
                    itemsize=torch.tensor([], dtype=dtype).element_size()))
    return results


def _naive_sum_ratio(model, ref_model, group):
    """||sum over CP of the vision grads|| / ||true grad||: what plain summing would give."""
    ref = dict(ref_model.named_parameters())
    num = den = 0.0
    for name, p in model["vision"].named_parameters():
        if grad_rule(p) is GradRule.PARTITIONED:
            continue
        g = p.grad.clone() if p.grad is not None else torch.zeros_like(p)
        dist.all_reduce(g, group=group)
        num += g.norm().item() ** 2
        den += ref[f"vision.{name}"].grad.norm().item() ** 2
    return (num / den) ** 0.5


def dp_cp_grid(group):
    """World of 4 = DP 2 x CP 2, each replica its own batch: both conventions, every mode."""
    cp = 2
    d, c = divmod(dist.get_rank(group), cp)
    # Every rank creates every group, in the same order (torch.distributed requires it).
    cp_group = [dist.new_group([2 * i, 2 * i + 1]) for i in range(2)][d]
    dp_group = [dist.new_group([j, 2 + j]) for j in range(2)][c]
    batches = [(IMAGE_SETS["four"], 3), ([(4, 4), (2, 6)], 4)]  # (image sizes, seed) per replica
    ref = ref_grads(*[reference(torch.float64, sizes, seed)[0] for sizes, seed in batches])
    sizes, seed = batches[d]
    out = []
    for mode in MODES:
        model, images, labels = build(torch.float64, sizes, seed, mode, cp_group)
        cp_step(model, images, labels, cp_group)
        report = reduce_gradients(model, cp_group, dp_group)
        errs = grad_errors(model, ref)
        ddp_model, images, labels = build(torch.float64, sizes, seed, mode, cp_group)
        cp_step(ddp_model, images, labels, cp_group, loss_scale=cp)
        _simulate_ddp(ddp_model, group)
        ddp_report = finish_ddp_gradients(ddp_model, cp_group, dp_group)
        ddp_errs = grad_errors(ddp_model, ref)
        assert max(errs.values()) <= 1e-10 and max(ddp_errs.values()) <= 1e-10, (mode, errs, ddp_errs)
        out.append(dict(mode=mode, errors=errs, ddp_errors=ddp_errs, report=report, ddp_report=ddp_report,
                        ignored=ddp_ignored_params(ddp_model)))
    return out


def loss_grid(group):
    """cp_cross_entropy against one process: uneven targets, a rank with none, none at all."""
    P, r = dist.get_world_size(group), dist.get_rank(group)
    n = [5, 3, 0, 4][:P]
    logits_all = [randn(200 + s, n[s], VOCAB).requires_grad_() for s in range(P)]
    labels_all = [torch.randint(0, VOCAB, (n[s],), generator=torch.Generator().manual_seed(300 + s))
                  for s in range(P)]
    labels_all[0][1] = -100
    labels_all[1][:] = -100  # rank 1 holds tokens but no target
    ref = F.cross_entropy(torch.cat(logits_all), torch.cat(labels_all), ignore_index=-100)
    ref.backward()
    logits = randn(200 + r, n[r], VOCAB).requires_grad_()
    with count_collectives() as calls:
        out = cp_cross_entropy(logits, labels_all[r], group)
    out.loss.backward()
    total = torch.tensor([out.loss.item()], dtype=torch.float64)
    dist.all_reduce(total, group=group)
    assert abs(total.item() - ref.item()) < 1e-14 and abs(out.mean.item() - ref.item()) < 1e-14
    assert rel_err(logits.grad, logits_all[r].grad) < 1e-13
    assert not out.mean.requires_grad

    empty = randn(9, 3, VOCAB).requires_grad_()
    none = cp_cross_entropy(empty, torch.full((3,), -100), group)
    none.loss.backward()
    assert none.loss.item() == 0 and none.mean.item() == 0 and not bool(empty.grad.any())

    half = cp_cross_entropy(randn(10, 2, VOCAB, dtype=torch.bfloat16), torch.tensor([0, 1]), group)
    return dict(calls=calls, half_dtype=str(half.loss.dtype), reduce=_mixed_reduction(group))


def _mixed_reduction(group):
    """reduce_gradients buckets by dtype, skips frozen parameters, and counts a missing grad as 0."""
    P, r = dist.get_world_size(group), dist.get_rank(group)
    m = nn.Module()
    m.a = nn.Parameter(torch.zeros(3, dtype=torch.float64))
    m.b = nn.Parameter(torch.zeros(2, dtype=torch.float32))
    m.c = nn.Parameter(torch.zeros(4, dtype=torch.float64))  # FULL: the same full grad everywhere
    m.d = nn.Parameter(torch.zeros(5, dtype=torch.float64))  # no grad on odd ranks
    m.frozen = nn.Parameter(torch.zeros(6), requires_grad=False)
    m.unused = nn.Parameter(torch.zeros(7, dtype=torch.float64))  # no grad on any rank
    # bf16: 1 + 2^-8 + 2^-8 loses both halves summed in bf16, not in float32
    m.e = nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
    set_grad_rule(m.c, GradRule.FULL, P)
    m.a.grad = torch.full((3,), float(r + 1), dtype=torch.float64)
    m.b.grad = torch.full((2,), float(10 * r), dtype=torch.float32)
    m.c.grad = torch.arange(4, dtype=torch.float64)
    if r % 2 == 0:
        m.d.grad = torch.ones(5, dtype=torch.float64)
    m.e.grad = torch.full((2,), 1.0 if r == 0 else 2.0 ** -8, dtype=torch.bfloat16)
    with count_collectives() as calls:
        report = reduce_gradients(m, group)
    assert torch.equal(m.a.grad, torch.full((3,), P * (P + 1) / 2, dtype=torch.float64))
    assert torch.equal(m.b.grad, torch.full((2,), 10.0 * P * (P - 1) / 2))
    assert torch.allclose(m.c.grad, torch.arange(4, dtype=torch.float64), rtol=0, atol=1e-15)
    assert torch.equal(m.d.grad, torch.full((5,), float((P + 1) // 2), dtype=torch.float64))
    assert m.frozen.grad is None
    assert m.unused.grad is None  # as in one process: the optimizer skips it instead of decaying it
    assert m.e.grad.dtype == torch.bfloat16
    assert torch.equal(m.e.grad, torch.full((2,), 1 + (P - 1) * 2.0 ** -8, dtype=torch.bfloat16))
    return dict(report=report, calls=calls)


def bad_inputs(group):
    """Every bad input raises the same clear error on every rank, before any collective."""
    P, r = dist.get_world_size(group), dist.get_rank(group)
    singles = [dist.new_group([i]) for i in range(P)]
    is_image = torch.tensor([1, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0], dtype=torch.bool)
    plan = plan_cp(is_image, P, torch.tensor([0, 7, 11]))  # samples with 4 and 2 image tokens
    img = lambda h, w: torch.zeros(3, h, w)
    attempts = {
        "mode": lambda: place_vision(make_encoder(torch.float64), mode="ring", group=group),
        "src": lambda: place_vision(make_encoder(torch.float64), mode="broadcast", group=group, src=P),
        "hidden": lambda: place_vision(VisionEncoder(VisionConfig(**{**VCFG, "out_dim": 2 * P + 1})),
                                       mode="hidden_shard", group=group),
        "twice": lambda: place_vision(place_vision(make_encoder(torch.float64), mode="scatter", group=group),
                                      mode="scatter", group=group),
        "patch": lambda: place_vision(make_encoder(torch.float64), mode="scatter", group=group)(
            [img(4, 4), img(5, 4)]),
        "count": lambda: check_images_match([img(4, 4), img(2, 4), img(2, 2)], plan, 2),
        "tokens": lambda: check_images_match([img(4, 6), img(2, 4)], plan, 2),
        "width": lambda: check_images_match([img(4, 4), img(2, 4)], plan, 2, embed_dim=12, hidden_size=16),
        "cp_size": lambda: reduce_gradients(place_vision(make_encoder(torch.float64), mode="allreduce_hook",
                                                         group=group), singles[r]),
    }
    messages = {}
    for name, attempt in attempts.items():
        try:
            attempt()
        except (ValueError, TypeError) as e:
            messages[name] = str(e)
        else:
            raise AssertionError(f"{name}: no error raised")
    assert check_images_match([img(4, 4), img(2, 4)], plan, 2, embed_dim=12, hidden_size=12) == [4, 2]
    alive = torch.ones(1)
    dist.all_reduce(alive, group=group)  # no rank is stuck in a collective
    return messages, int(alive.item())


@functools.cache
def grid_results(P):
    """One spawned group per P, shared by the placement and gradient tests."""
    return run_on_ranks(placement_grid, P, timeout=150)


def frozen_projector(group):
    """A trainable ViT under a frozen projector: ranks without images still join the backward."""
    errs = {}
    ref_model, _, _ = reference(torch.float64, IMAGE_SETS["one"], seed=5)
    ref = ref_grads(ref_model)
    for mode, src in (("scatter", 0), ("broadcast", dist.get_world_size(group) - 1)):
        model, images, labels = build(torch.float64, IMAGE_SETS["one"], 5)
        model["vision"].projector.requires_grad_(False)
        place_vision(model["vision"], mode=mode, group=group, src=src)
        cp_step(model, images, labels, group)
        reduce_gradients(model, group)
        errs[mode] = max(rel_err(p.grad, ref[f"vision.tower.{n}"])
                         for n, p in model["vision"].tower.named_parameters())
        assert errs[mode] <= 1e-10 and model["vision"].projector.fc1.weight.grad is None, (mode, errs)
    return errs
