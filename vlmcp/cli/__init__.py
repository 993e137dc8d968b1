"""The ``vlmcp`` command line: one module per subcommand, registered here.

Only the command being run is imported (with it torch and the rest of vlmcp): ``vlmcp --help``
and a mistyped command cost a fraction of a second. Each command's one-line help sits in
:data:`_COMMANDS`, beside the module that builds its parser.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from vlmcp import __version__
from vlmcp.deps import UntestedVersion, check_versions
from vlmcp.ranks import RanksFailed

__all__ = ["main"]

_HF_EXTRA = ("transformers", "tokenizers", "safetensors", "huggingface_hub", "PIL", "av")
"""Modules the ``hf`` extra brings (``init-model``, ``data shapes``, ``train --model``; ``av``: videos)."""

_COMMANDS = {
    "train": ("vlmcp.cli.train", "train the reference VLM on the built-in data, or an HF VLM (--model)"),
    "verify": ("vlmcp.cli.verify", "check CP gradients against a single process"),
    "plan": ("vlmcp.cli.plan", "print the per-rank layout and work of a packed row"),
    "compare": ("vlmcp.cli.compare", "measure a naive CP layout against vlmcp's (the seed's table)"),
    "bench": ("vlmcp.cli.bench", "run the benchmarks (planner, attention, memory, vision, hf-*)"),
    "init-model": ("vlmcp.cli.init_model", "write a small random HF VLM directory (offline)"),
    "data": ("vlmcp.cli.data", "export datasets as JSONL conversations; show what a line trains"),
}
"""Command -> (its module, its one-line help). The module's ``add_parser(sub)`` registers the
command with that help (:func:`command_help`), and ``run(args)`` runs it."""


def command_help(name: str) -> str:
    """The one-line help of command ``name`` (the modules pass it to ``sub.add_parser``)."""
    return _COMMANDS[name][1]


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keep the docstrings' line breaks and show every default (a help text that states its
    defaults itself, ``(default: ...)``, is left as it is)."""

    def _get_help_string(self, action):
        if "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)


def _uses_transformers(args: argparse.Namespace) -> bool:
    """Whether the parsed command reads a Hugging Face model (its transformers must be in range)."""
    return (args.command == "init-model" or bool(getattr(args, "model", None))
            or str(getattr(args, "bench", "")).startswith("hf-"))


def _chosen(argv: list[str]) -> str | None:
    """The command in ``argv`` (its first word that is not an option), if it is one."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in _COMMANDS else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _Parser(prog="vlmcp", description="Context parallelism for vision-language models.",
                     epilog="environment: VLMCP_ALLOW_UNTESTED_VERSIONS=1 runs with a transformers, peft, "
                            "trl or accelerate release outside the ranges vlmcp was tested with (a "
                            "warning instead of the refusal; the ranges: vlmcp.deps.TESTED, "
                            "docs/training.md)")
    parser.add_argument("--version", action="version", version=f"vlmcp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    command = _chosen(argv)
    for name, (module, one_line) in _COMMANDS.items():
        if name == command:
            importlib.import_module(module).add_parser(sub)
        else:  # never parsed: only the chosen command's parser is built
            sub.add_parser(name, help=one_line, add_help=False)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the command's own usage, not the top level's
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        if _uses_transformers(args):
            check_versions("transformers")  # before a model is built, a file written or a rank started
        return int(importlib.import_module(_COMMANDS[args.command][0]).run(args) or 0)
    except RanksFailed:
        return 1  # the failing rank's line is printed
    except KeyboardInterrupt:  # Ctrl-C before any rank started (a training run's ranks stop as on SIGTERM)
        print(f"\nvlmcp {args.command}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, NotImplementedError, UntestedVersion) as err:
        print(f"vlmcp {args.command}: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] in _HF_EXTRA:
            # a plain install has no transformers: say which extra brings it, not a traceback
            print(f"vlmcp {args.command}: error: this needs the Hugging Face extra ({err.name} is not "
                  "installed): pip install 'vlmcp[hf]'", file=sys.stderr)
            return 2
        raise
