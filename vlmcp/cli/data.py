"""``vlmcp data``: datasets as files ``vlmcp train --data`` reads.

``vlmcp data shapes --out DIR --samples N`` exports the built-in shapes-and-captions
data as ``DIR/train.jsonl`` (LLaMA-Factory / ms-swift ``messages`` + ``images``) and
``DIR/images/*.png``.
"""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("data", help="export datasets as JSONL conversations", description=__doc__)
    kinds = p.add_subparsers(dest="dataset", required=True, metavar="DATASET")
    shapes = kinds.add_parser("shapes", help="the built-in shapes-and-captions data",
                              formatter_class=p.formatter_class)
    shapes.add_argument("--out", required=True, metavar="DIR", help="writes DIR/train.jsonl and DIR/images/")
    shapes.add_argument("--samples", type=int, default=1000, help="conversations to write")
    shapes.add_argument("--seed", type=int, default=0, help="dataset seed")


def run(args: argparse.Namespace) -> int:
    from vlmcp.cli.paths import check_writable_dir
    from vlmcp.data.hf.export import export_shapes

    if args.samples < 1:
        raise ValueError(f"--samples must be an integer >= 1, got {args.samples}")
    check_writable_dir("--out", args.out)

    path = export_shapes(args.out, args.samples, seed=args.seed)
    print(f"vlmcp data shapes: wrote {args.samples} conversations to {path}")
    return 0
