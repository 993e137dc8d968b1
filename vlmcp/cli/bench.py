"""``vlmcp bench``: the measured figures of docs/benchmarks.md (speed and memory; minutes, not tests).

``vlmcp bench NAME --help`` lists one benchmark's flags; ``vlmcp bench all`` runs every
benchmark on its defaults. A progress line goes to stderr as each benchmark starts, so
the figures on stdout (``vlmcp bench vision --json`` included) stay clean.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from vlmcp.bench import BENCHMARKS
from vlmcp.cli import command_help
from vlmcp.cli.config_file import add_config_arguments, set_config_help
from vlmcp.ranks import failures_reported

_MODULES = {name: importlib.import_module(module) for name, module in BENCHMARKS.items()}
_HELP = {
    "plan": "time plan_cp and every rank's for_rank on a long packed row",
    "attention": "CP attention time and saved bytes per rank against one process, ring and ulysses",
    "memory": "saved-for-backward bytes per rank of one VLM training step against one process",
    "vision": "ViT time per rank, replicate against scatter",
    "hf-memory": "a HF Qwen2-VL/Qwen3-VL/Qwen3.5 saved bytes per rank: videos, image_strategy "
                 "replicate/shard/auto",
    "hf-vision": "a HF Qwen2-VL/Qwen3-VL/Qwen3.5 ViT time per rank for one long video, replicate "
                 "against scatter",
    "hf-loss": "what a HF Qwen2-VL's LM head and loss save at a real vocabulary: full logits against chunked",
    "hf-step": "a HF Qwen2-VL's whole training step at P against one process: speed-up and the busiest "
               "rank's peak, image_strategy and --loss chunked/full",
    "hf-estimate": "vlmcp plan --model's memory estimate against the exact saved-bytes counter on tiny "
                   "models",
}


_CONFIG_FILE = ("hf-step", "hf-estimate")
"""Benchmarks whose flags also read ``--config FILE.yaml``."""


def _defaults(name: str) -> argparse.Namespace:
    """The namespace ``vlmcp bench NAME`` parses with no flags."""
    parser = argparse.ArgumentParser()
    _MODULES[name].add_arguments(parser)
    return parser.parse_args([])


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help=command_help("bench"),
                       description=__doc__)
    benches = p.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    for name, module in _MODULES.items():
        # Only names travel in the namespace: the attention benchmark pickles it to its ranks.
        bp = benches.add_parser(name, help=_HELP[name], description=module.__doc__)
        module.add_arguments(bp)
        if name in _CONFIG_FILE:
            add_config_arguments(bp)
            set_config_help(bp, "read flags from a YAML or JSON file (keys: the flags' names, e.g. tokens: "
                                "4096); flags given here override it")
    benches.add_parser("all", help="every benchmark above on its defaults (minutes)",
                       description="Run " + ", ".join(BENCHMARKS) + " in turn, each on its defaults.")


def run(args: argparse.Namespace) -> int:
    if args.bench != "all":
        return _run_one(args.bench, args, 1, 1)
    for i, name in enumerate(BENCHMARKS, 1):
        rc = _run_one(name, _defaults(name), i, len(BENCHMARKS))
        if rc:
            return rc
    return 0


def _run_one(name: str, args: argparse.Namespace, index: int, total: int) -> int:
    part = f" ({index}/{total})" if total > 1 else ""
    sys.stdout.flush()  # keep the progress lines in order with the figures when both are piped
    print(f"vlmcp bench {name}{part}: {_HELP[name]}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with failures_reported(f"vlmcp bench {name}"):  # a rank's failure: one line per rank, exit 1
        rc = int(_MODULES[name].run(args) or 0)
    sys.stdout.flush()
    print(f"vlmcp bench {name}: done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return rc
