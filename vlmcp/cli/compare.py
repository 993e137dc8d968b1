"""``vlmcp compare``: the seed's summary table, measured on one model and one packed row.

A naive CP (zigzag over the merged row, attention only among a rank's own tokens)
against vlmcp's layouts, each compared with one process: whether every rank holds
the complete image features, ViT and projector gradient norms, loss and gradient
error, saved activations per rank. Prints the table and writes it as markdown.
"""

from __future__ import annotations

import argparse

from vlmcp.cli import command_help
from vlmcp.cli.paths import check_writable_file
from vlmcp.ranks import run_command


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help=command_help("compare"),
                       description=__doc__)
    p.add_argument("--cp", type=int, default=2, help="CP group size")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens of the packed row")
    p.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    p.add_argument("--seed", type=int, default=0, help="dataset seed")
    p.add_argument("--out", default="compare.md", help="markdown file to write")


def run(args: argparse.Namespace) -> int:
    from vlmcp.data import ShapesDataset, pack_row
    from vlmcp.debug.seed_table import compare_rank, markdown_table
    from vlmcp.train.specs.reference.config import ReferenceTrainConfig as TrainConfig
    from vlmcp.train.specs.reference.spec import dataset_config, model_config

    cfg = TrainConfig(cp=args.cp, seq_len=args.seq_len, seed=args.seed)
    row = pack_row(ShapesDataset(dataset_config(cfg)), cfg.seq_len, 0)
    out = check_writable_file("--out", args.out)
    print(f"vlmcp compare: one training step at P={cfg.cp}, {args.dtype}, on a packed row of "
          f"{row.seq_len} tokens ({row.num_samples} samples, {len(row.images)} images, "
          f"{int(row.is_image.sum())} image tokens)", flush=True)
    rows = run_command("vlmcp compare", compare_rank, cfg.cp, model_config(cfg), row, args.dtype, timeout=600,
                       torchrun=False, threads_per_rank=1)
    table = markdown_table(rows)
    print(table)
    out.write_text(table + "\n")
    print(f"vlmcp compare: table written to {out}")
    return 0
