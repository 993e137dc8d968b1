"""``vlmcp init-model``: write a small random Hugging Face VLM directory, offline.

The directory (config.json, safetensors weights, a tokenizer built in code with the
architecture's chat template and special tokens, the processor config) loads with
``AutoProcessor.from_pretrained(DIR)`` and ``AutoModelForImageTextToText.from_pretrained(DIR)``;
``vlmcp train --model DIR`` trains it. For trying the pipeline without downloads, and for tests.
"""

from __future__ import annotations

import argparse

from vlmcp.cli import command_help
from vlmcp.cli.paths import check_writable_dir


def add_parser(sub) -> None:
    from vlmcp.debug.init_model import ARCHS

    p = sub.add_parser("init-model", help=command_help("init-model"),
                       description=__doc__)
    p.add_argument("--arch", required=True, choices=ARCHS, help="model architecture")
    p.add_argument("--out", required=True, metavar="DIR", help="the model directory to write")
    p.add_argument("--seed", type=int, default=0, help="weight initialization seed")
    p.add_argument("--force", action="store_true",
                   help="write into --out even if it already holds files (a trained model there is lost)")


def run(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the hub
    from pathlib import Path

    from vlmcp.debug.init_model import init_model

    out = Path(args.out)
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise ValueError(f"--out {args.out} already holds files (a model trained there would be replaced); "
                         "pass --force to overwrite it, or choose an empty directory")
    check_writable_dir("--out", args.out)

    out = init_model(args.arch, args.out, seed=args.seed)
    print(f"vlmcp init-model: wrote a random {args.arch} model to {out}")
    return 0
