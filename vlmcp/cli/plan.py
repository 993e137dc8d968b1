"""``vlmcp plan``: show a packed row's layout over a CP group, and its work balance.

With ``--model DIR``: a CP rank's predicted peak memory for one training step of that model instead
(:mod:`vlmcp.cli.plan_model`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from vlmcp.attention.exchange import ring_bytes_sent
from vlmcp.cli import command_help, plan_model
from vlmcp.cli.config_file import add_config_arguments, set_config_help
from vlmcp.cli.paths import check_writable_file
from vlmcp.layout import CostModel, CPPlan, TokenKind, WorkReport, attended_pairs, plan_cp
from vlmcp.layout.cost import DEFAULT_FLOPS_PER_BYTE, DEFAULT_HIDDEN_SIZE, DEFAULT_MLP_RATIO

# The built-in example: 3 packed chat-like samples (a prompt, an image, the answer), one text only.
DEFAULT_PROMPT_TOKENS = "12,0,20"
DEFAULT_IMAGE_TOKENS = "64,0,48"
DEFAULT_TEXT_TOKENS = "120,77,201"


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help=command_help("plan"),
                       description=__doc__)
    p.add_argument("--cp", type=int, default=4, help="CP group size P")
    p.add_argument("--prompt-tokens", default=None,
                   help="text tokens before each sample's image, comma-separated, or one count for "
                        f"every sample ({DEFAULT_PROMPT_TOKENS} for the built-in example, else 0)")
    p.add_argument("--image-tokens", default=DEFAULT_IMAGE_TOKENS,
                   help="image tokens per sample, comma-separated")
    p.add_argument("--text-tokens", default=DEFAULT_TEXT_TOKENS,
                   help="text tokens after each sample's image, comma-separated")
    p.add_argument("--image-strategy", choices=["replicate", "shard", "auto"], default="replicate",
                   help="where image tokens live; 'auto' prices both layouts with the cost model "
                        "and prints the estimates")
    p.add_argument("--image-attention", choices=["causal", "bidirectional"], default="causal")
    p.add_argument("--sample-placement", choices=["split", "whole", "auto"], default="split",
                   help="split every sample, place each whole on one rank, or auto (short samples whole, "
                        "by the cost model)")
    p.add_argument("--width", type=int, default=96, help="characters of the row picture")
    p.add_argument("--kv-heads", type=int, default=8, help="K/V heads, for the bytes column")
    p.add_argument("--head-dim", type=int, default=128, help="head size, for the bytes column")
    p.add_argument("--dtype", choices=["bfloat16", "float32", "float64"], default="bfloat16",
                   help="activation dtype, for the bytes column")
    p.add_argument("--hidden-size", type=int, default=DEFAULT_HIDDEN_SIZE,
                   help="LLM width, for the 'auto' cost model")
    p.add_argument("--mlp-ratio", type=float, default=DEFAULT_MLP_RATIO,
                   help="SwiGLU intermediate size / hidden size, for 'auto'")
    p.add_argument("--flops-per-byte", type=float, default=DEFAULT_FLOPS_PER_BYTE,
                   help="FLOPs a rank could do in the time it sends one byte (achieved FLOP/s over "
                        "link bytes/s), for 'auto'")
    p.add_argument("--out", metavar="FILE.png", default=None,
                   help="also draw the layout and the attention mask split between ranks to a PNG "
                        "(or another format matplotlib writes: .svg, .pdf, ...)")
    plan_model.add_arguments(p)
    p.set_defaults(_plan_defaults={a.dest: a.default for a in p._actions})
    add_config_arguments(p)  # every flag also a key of --config FILE.yaml
    set_config_help(p, "read flags from a YAML or JSON file (keys: the flags' names, e.g. seq_len: 4096); "
                       "flags given here override it")


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in values):
        raise ValueError(f"{flag} must be >= 0, got {text!r}")
    return values


def _check_picture(path: str) -> None:
    """``--out`` names a writable file whose suffix matplotlib writes (it would add .png to none)."""
    from matplotlib.backend_bases import FigureCanvasBase

    check_writable_file("--out", path)
    formats = FigureCanvasBase.get_supported_filetypes()
    if Path(path).suffix[1:].lower() not in formats:
        raise ValueError(f"--out {path}: needs a picture suffix, one of "
                         + ", ".join("." + f for f in sorted(formats)))


def build_row(image_tokens: list[int], text_tokens: list[int],
              prompt_tokens: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``is_image`` and ``cu_seqlens`` of a packed row of ``[prompt | image | text]`` samples."""
    prompt_tokens = [0] * len(image_tokens) if prompt_tokens is None else prompt_tokens
    if not len(image_tokens) == len(text_tokens) == len(prompt_tokens):
        raise ValueError(f"{len(prompt_tokens)} prompt, {len(image_tokens)} image and {len(text_tokens)} "
                         "text counts: give one of each per sample")
    if any(p + i + t == 0 for p, i, t in zip(prompt_tokens, image_tokens, text_tokens, strict=True)):
        raise ValueError("every sample needs at least one token")
    parts = [torch.cat([torch.zeros(p, dtype=torch.bool), torch.ones(i, dtype=torch.bool),
                        torch.zeros(t, dtype=torch.bool)])
             for p, i, t in zip(prompt_tokens, image_tokens, text_tokens, strict=True)]
    lens = torch.tensor([p.numel() for p in parts])
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
    return torch.cat(parts), cu


def row_picture(plan: CPPlan, width: int) -> str:
    """One character per bucket of the global row: the owning rank, '#' if replicated."""
    owner = torch.full((plan.seq_len,), -1, dtype=torch.long)
    for shard in plan.shards():
        pos = shard.positions[shard.positions >= 0]
        rep = shard.replicated[shard.positions >= 0]
        owner[pos[~rep]] = shard.rank
        owner[pos[rep]] = -2
    per = max(1, -(-plan.seq_len // width))
    chars = []
    for start in range(0, plan.seq_len, per):
        o = int(owner[start])
        chars.append("#" if o == -2 else "0123456789abcdefghijklmnopqrstuvwxyz"[o % 36])
    bounds = set((plan.cu_seqlens[1:-1] // per).tolist())
    line = "".join(("|" if i in bounds else "") + c for i, c in enumerate(chars))
    return f"global row, 1 char = {per} token(s), '#' = on every rank, '|' = sample boundary:\n  {line}"


def rank_pictures(plan: CPPlan, width: int) -> str:
    lines = ["local rows ('I' image, 't' text, '.' padding, '|' sample boundary):"]
    per = max(1, -(-plan.for_rank(0).num_tokens // width))
    for shard in plan.shards():
        sym = {TokenKind.TEXT: "t", TokenKind.IMAGE: "I", TokenKind.PAD: "."}
        chars = [sym[int(k)] for k in shard.kinds[::per]]
        bounds = set((shard.cu_seqlens[1:-1].long() // per).tolist())
        lines.append(f"  rank {shard.rank}: " +
                     "".join(("|" if i in bounds else "") + c for i, c in enumerate(chars)))
    return "\n".join(lines)


def _aligned(head: tuple[str, ...], rows: list) -> list[str]:
    """Right-aligned text table: header, rule, rows (cells already strings)."""
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]

    def line(cells) -> str:
        return "  ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True))

    return [line(head), line(["-" * w for w in widths]), *(line(row) for row in rows)]


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def work_table(plan: CPPlan, work: WorkReport, kv_heads: int = 8, head_dim: int = 128,
               itemsize: int = 2) -> str:
    """Per-rank tokens, attended pairs, and ring bytes sent per attention layer."""
    head = ("rank", "slots", "image", "text", "pad", "text pairs", "image pairs", "total pairs",
            "ring bytes sent/layer fwd", "bwd")
    rows = []
    for shard in plan.shards():
        r = shard.rank
        fwd, bwd = ring_bytes_sent(shard, kv_heads, head_dim, itemsize)
        rows.append((r, shard.num_tokens, int(shard.is_image.sum()), int(shard.is_text.sum()),
                     int(shard.is_pad.sum()), work.text_pairs[r], work.image_pairs[r],
                     work.total_pairs[r], _bytes(fwd), _bytes(bwd)))
    cells = [[f"{c:,}" if isinstance(c, int) else str(c) for c in row] for row in rows]
    out = _aligned(head, cells)
    out.append(f"balance max/mean: total {work.balance:.3f}, text {work.text_balance:.3f}; "
               f"single-process pairs {work.single_process_pairs:,}; "
               f"efficiency vs ideal (single/P over busiest) {work.efficiency:.3f}")
    return "\n".join(out)


def cost_table(plan: CPPlan, model: CostModel) -> str:
    """The cost model's estimate of each candidate layout of an ``"auto"`` plan, and the choice."""
    head = ("layout", "local tokens", "pairs", "ring bytes sent", "attention", "token-wise",
            "comm", "total", "busiest rank")
    rows = []
    for e in plan.cost_estimates:
        rows.append((e.image_strategy + ("" if e.fits else " (over budget)"), f"{e.local_tokens:,}",
                     f"{e.pairs:,}", _bytes(e.bytes_sent), _flops(e.attention_flops),
                     _flops(e.token_flops), _flops(e.comm_flops), _flops(e.cost), str(e.busiest_rank)))
    out = [f"image_strategy=auto: cost of the busiest rank per layer, forward + backward, in FLOPs: "
           f"{model.flops_per_token:.4g} per local token,\n  {model.flops_per_pair:.4g} per attended "
           f"pair, {model.flops_per_byte:g} per ring byte sent (see vlmcp.layout.CostModel)",
           *_aligned(head, rows)]
    costs = {e.image_strategy: e.cost for e in plan.cost_estimates}
    other = "shard" if plan.image_strategy == "replicate" else "replicate"
    if plan.cp_size == 1:
        why = "P = 1: every rank holds every token"
    elif costs[other] == costs[plan.image_strategy]:
        why = "a tie goes to replicate"
    else:
        why = f"{1 - costs[plan.image_strategy] / costs[other]:.1%} cheaper than {other}"
    out.append(f"chosen: {plan.image_strategy} ({why})")
    return "\n".join(out)


def _flops(x: float) -> str:
    for unit, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if x >= size:
            return f"{x / size:.2f} {unit}"
    return f"{x:.0f}"


def run(args: argparse.Namespace) -> int:
    plan_model.check_flags(args, args._plan_defaults)
    if args.model is not None:
        return plan_model.run(args)
    image = _int_list(args.image_tokens, "--image-tokens")
    text = _int_list(args.text_tokens, "--text-tokens")
    for flag, value in (("--width", args.width), ("--kv-heads", args.kv_heads),
                        ("--head-dim", args.head_dim)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.prompt_tokens is None:
        builtin = (args.image_tokens, args.text_tokens) == (DEFAULT_IMAGE_TOKENS, DEFAULT_TEXT_TOKENS)
        args.prompt_tokens = DEFAULT_PROMPT_TOKENS if builtin else "0"
    prompt = _int_list(args.prompt_tokens, "--prompt-tokens")
    if len(prompt) == 1 and len(image) > 1:
        prompt = prompt * len(image)  # one prompt length for every sample
    is_image, cu = build_row(image, text, prompt)
    itemsize = {"bfloat16": 2, "float32": 4, "float64": 8}[args.dtype]
    model = None
    if args.image_strategy == "auto":
        model = CostModel.for_transformer(
            hidden_size=args.hidden_size, mlp_ratio=args.mlp_ratio, kv_heads=args.kv_heads,
            head_dim=args.head_dim, itemsize=itemsize, flops_per_byte=args.flops_per_byte,
            image_attention=args.image_attention)
    plan = plan_cp(is_image, args.cp, cu, image_strategy=args.image_strategy, cost_model=model,
                   sample_placement=args.sample_placement)
    work = attended_pairs(plan, args.image_attention)
    if args.out is not None:
        _check_picture(args.out)
    whole = int((plan.whole >= 0).sum())
    print(f"vlmcp plan: {plan.num_samples} samples, L={plan.seq_len}, P={plan.cp_size}, "
          f"image_strategy={plan.image_strategy}, image_attention={args.image_attention}, "
          f"sample_placement={args.sample_placement} ({whole} of {plan.num_samples} samples whole)")
    if model is not None:
        print(cost_table(plan, model))
    print(row_picture(plan, args.width))
    print(rank_pictures(plan, args.width))
    print(work_table(plan, work, args.kv_heads, args.head_dim, itemsize))
    print(f"bytes: ring attention, {args.kv_heads} K/V heads of {args.head_dim}, {args.dtype} "
          f"(dK/dV in float32 or wider); "
          + ("image K/V never travel" if plan.image_strategy == "replicate" else "image K/V travel too"))
    if args.out:
        from vlmcp.report import draw_plan  # matplotlib only when a picture is asked for

        print(f"picture written to {draw_plan(plan, args.out, image_attention=args.image_attention)}")
    return 0
