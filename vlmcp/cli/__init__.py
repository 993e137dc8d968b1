"""The ``vlmcp`` command line: one module per subcommand, registered here."""

from __future__ import annotations

import argparse
import sys

from vlmcp.cli import bench as bench_cmd
from vlmcp.cli import compare as compare_cmd
from vlmcp.cli import data as data_cmd
from vlmcp.cli import init_model as init_model_cmd
from vlmcp.cli import plan as plan_cmd
from vlmcp.cli import train as train_cmd
from vlmcp.cli import verify as verify_cmd
from vlmcp.cli.ranks import RanksFailed

__all__ = ["main"]

_HF_EXTRA = ("transformers", "tokenizers", "safetensors", "huggingface_hub", "PIL", "av")
"""Modules the ``hf`` extra brings (``init-model``, ``data shapes``, ``train --model``; ``av``: videos)."""

_COMMANDS = {"train": train_cmd, "verify": verify_cmd, "plan": plan_cmd, "compare": compare_cmd,
             "bench": bench_cmd, "init-model": init_model_cmd, "data": data_cmd}


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keep the docstrings' line breaks and show every default."""


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)


def main(argv: list[str] | None = None) -> int:
    from vlmcp import __version__

    parser = _Parser(prog="vlmcp", description="Context parallelism for vision-language models.")
    parser.add_argument("--version", action="version", version=f"vlmcp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for _name, module in _COMMANDS.items():
        module.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return int(_COMMANDS[args.command].run(args) or 0)
    except RanksFailed:
        return 1  # the failing rank's line is printed
    except (ValueError, NotImplementedError) as err:
        print(f"vlmcp {args.command}: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] in _HF_EXTRA:
            # a plain install has no transformers: say which extra brings it, not a traceback
            print(f"vlmcp {args.command}: error: this needs the Hugging Face extra ({err.name} is not "
                  "installed): pip install 'vlmcp[hf]'", file=sys.stderr)
            return 2
        raise
