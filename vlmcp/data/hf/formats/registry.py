"""The registered formats, and which one reads a line.

Every format looks at a line (:meth:`DataFormat.detect`):

* one format is *certain* (the line has something only it has): it reads the line;
* several are certain: an error naming each and why (e.g. ``image`` and ``images``);
* none is certain and one fits: it reads the line;
* several fit (LLaVA and sharegpt both write ``conversations`` of ``human``/``gpt``
  turns): each reads it; when the readings agree that is the conversation; when they
  differ (a leading ``gpt`` turn: LLaVA drops it, sharegpt refuses the line), the format
  that other lines of the same file are certainly in decides, and if none or several
  are, the line is an error rather than a guess;
* none fits: an error listing what each format needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from vlmcp.data.hf.formats.base import DataFormat, Line
from vlmcp.data.hf.schema import Conversation, Skipped

__all__ = ["certain_formats", "data_formats", "read_record", "register_format"]

_FORMATS: dict[str, DataFormat] = {}


def register_format(fmt: DataFormat) -> None:
    """Read lines in ``fmt`` too (replacing a format of the same name)."""
    if not isinstance(fmt, DataFormat):
        raise TypeError(f"register_format expects a DataFormat, got {type(fmt).__name__}")
    _FORMATS[fmt.name] = fmt


def data_formats() -> tuple[DataFormat, ...]:
    """The registered formats, in registration order."""
    return tuple(_FORMATS.values())


def certain_formats(record: Mapping[str, Any]) -> frozenset[str]:
    """Names of the formats certain that ``record`` is theirs."""
    return frozenset(f.name for f in _FORMATS.values() if (d := f.detect(record)) is not None and d.certain)


def _attempt(fmt: DataFormat, record: Mapping[str, Any], line: Line) -> Conversation | Skipped | ValueError:
    try:
        return fmt.read(record, line)
    except ValueError as err:
        return err


def _summary(outcome: Conversation | Skipped | ValueError) -> str:
    if isinstance(outcome, ValueError):
        return f"refused ({str(outcome).split(': ', 1)[-1]})"
    if isinstance(outcome, Skipped):
        return f"skipped ({outcome.reason})"
    dropped = f", {outcome.dropped_turns} turn(s) dropped" if outcome.dropped_turns else ""
    return f"{len(outcome.messages)} message(s){dropped}"


def _settle(outcome: Conversation | Skipped | ValueError) -> Conversation | Skipped:
    if isinstance(outcome, ValueError):
        raise outcome
    return outcome


def read_record(record: Mapping[str, Any], line: Line,
                file_formats: Callable[[], frozenset[str]]) -> Conversation | Skipped:
    """The conversation of one line, read by the format that owns it (module docstring).

    Args:
        record: the line's JSON object.
        line: where it is.
        file_formats: the names of the formats some line of the same file is certainly in
            (called only when fitting formats read the line differently).
    """
    claims = [(f, d) for f in _FORMATS.values() if (d := f.detect(record)) is not None]
    certain = [(f, d) for f, d in claims if d.certain]
    if len(certain) > 1:
        fits = ", ".join(f"{f.name} ({d.reason})" for f, d in certain)
        raise line.error(f"the line fits several formats: {fits}; a line is one format")
    if certain:
        return certain[0][0].read(record, line)
    if not claims:
        raise line.error(f"no --data format has the keys {sorted(record)}; vlmcp reads "
                         + "; ".join(f"{f.name}: {f.signature}" for f in _FORMATS.values()))
    outcomes = [(f, _attempt(f, record, line)) for f, _ in claims]
    first = outcomes[0][1]
    refused = isinstance(first, ValueError)
    if all(o == first or (refused and isinstance(o, ValueError)) for _, o in outcomes):
        return _settle(first)
    known = file_formats()
    chosen = [o for f, o in outcomes if f.name in known]
    if len(chosen) == 1:
        return _settle(chosen[0])
    readings = " and as ".join(f"{f.name}: {_summary(o)}" for f, o in outcomes)
    raise line.error(f"the line reads differently as {readings}, and no other line of the file is "
                     "certainly one of these formats; convert it to the format meant")
