"""``vlmcp plan``: show a packed row's layout over a CP group, and its work balance."""

from __future__ import annotations

import argparse

import torch

from vlmcp.layout import CPPlan, TokenKind, WorkReport, attended_pairs, plan_cp

# The built-in example: 3 packed samples, one of them without an image.
DEFAULT_IMAGE_TOKENS = "64,0,48"
DEFAULT_TEXT_TOKENS = "120,77,201"


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="print the per-rank layout and work of a packed row",
                       description=__doc__)
    p.add_argument("--cp", type=int, default=4, help="CP group size P (default 4)")
    p.add_argument("--image-tokens", default=DEFAULT_IMAGE_TOKENS,
                   help=f"image tokens per sample, comma-separated (default {DEFAULT_IMAGE_TOKENS})")
    p.add_argument("--text-tokens", default=DEFAULT_TEXT_TOKENS,
                   help=f"text tokens per sample, comma-separated (default {DEFAULT_TEXT_TOKENS})")
    p.add_argument("--image-strategy", choices=["replicate", "shard"], default="replicate")
    p.add_argument("--image-attention", choices=["causal", "bidirectional"], default="causal")
    p.add_argument("--width", type=int, default=96, help="characters of the row picture")
    p.add_argument("--out", metavar="FILE.png", default=None,
                   help="also draw the layout and the attention mask split between ranks to a PNG")


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in values):
        raise ValueError(f"{flag} must be >= 0, got {text!r}")
    return values


def build_row(image_tokens: list[int], text_tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``is_image`` and ``cu_seqlens`` of a packed row of ``[image | text]`` samples."""
    if len(image_tokens) != len(text_tokens):
        raise ValueError(f"{len(image_tokens)} image counts for {len(text_tokens)} samples")
    parts = [torch.cat([torch.ones(i, dtype=torch.bool), torch.zeros(t, dtype=torch.bool)])
             for i, t in zip(image_tokens, text_tokens, strict=False)]
    lens = torch.tensor([i + t for i, t in zip(image_tokens, text_tokens, strict=False)])
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


def work_table(plan: CPPlan, work: WorkReport) -> str:
    head = ("rank", "slots", "image", "text", "pad", "text pairs", "image pairs", "total pairs")
    rows = []
    for shard in plan.shards():
        r = shard.rank
        rows.append((r, shard.num_tokens, int(shard.is_image.sum()), int(shard.is_text.sum()),
                     int(shard.is_pad.sum()), work.text_pairs[r], work.image_pairs[r],
                     work.total_pairs[r]))
    widths = [max(len(str(h)), *(len(f"{row[i]:,}") for row in rows)) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(f"{c:>{w},}" if isinstance(c, int) else f"{c:>{w}}"  # noqa: E731
                                  for c, w in zip(cells, widths, strict=False))
    out = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(row) for row in rows]
    out.append(f"balance max/mean: total {work.balance:.3f}, text {work.text_balance:.3f}; "
               f"single-process pairs {work.single_process_pairs:,}; "
               f"efficiency vs ideal (single/P over busiest) {work.efficiency:.3f}")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    image = _int_list(args.image_tokens, "--image-tokens")
    text = _int_list(args.text_tokens, "--text-tokens")
    is_image, cu = build_row(image, text)
    plan = plan_cp(is_image, args.cp, cu, image_strategy=args.image_strategy)
    work = attended_pairs(plan, args.image_attention)
    print(f"vlmcp plan: {plan.num_samples} samples, L={plan.seq_len}, P={plan.cp_size}, "
          f"image_strategy={plan.image_strategy}, image_attention={args.image_attention}")
    print(row_picture(plan, args.width))
    print(rank_pictures(plan, args.width))
    print(work_table(plan, work))
    if args.out:
        from vlmcp.report import draw_plan  # matplotlib only when a picture is asked for

        print(f"picture written to {draw_plan(plan, args.out, image_attention=args.image_attention)}")
    return 0
