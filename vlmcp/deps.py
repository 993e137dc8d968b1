"""The versions of the Hugging Face stack vlmcp is tested with, and the start-up check against them.

vlmcp reaches into transformers' models (rope indices, processors' expansions, float32 islands,
attention interfaces), so a new minor release can change what a row trains without an error. The
ranges below are the ones CI has passed: their lowest releases (``make compat-lowest``) and their
newest (``requirements/ci.txt``, ``make test``); ``make compat`` tries the registry's newest.
:func:`check_versions` refuses anything else in one line, before a model is built or a rank
starts; ``VLMCP_ALLOW_UNTESTED_VERSIONS=1`` turns the refusal into a one-line warning.

``pyproject.toml``'s extras state the same ranges (``tests/test_deps.py`` holds the two together).
"""

from __future__ import annotations

import os
import re
import sys
from importlib import metadata

__all__ = ["OVERRIDE", "TESTED", "UntestedVersion", "at_least", "check_versions", "installed", "parse"]

TESTED: dict[str, tuple[str, str]] = {
    "transformers": ("5.24.0", "5.26"),
    "peft": ("0.21.0", "0.23"),
    "trl": ("1.15.0", "1.17"),
    "accelerate": ("1.15.0", "1.17"),
}
"""Package -> (lowest tested release, first untested minor): ``lowest <= version < bound``."""

OVERRIDE = "VLMCP_ALLOW_UNTESTED_VERSIONS"
"""Set to ``1`` to run with a version outside :data:`TESTED` (a warning instead of the refusal)."""


_WARNED: set[tuple[str, str]] = set()


class UntestedVersion(RuntimeError):
    """An installed package's version is outside the range vlmcp was tested with."""


def parse(version: str) -> tuple[int, ...]:
    """``"5.25.0"`` -> ``(5, 25, 0)``; a pre-release or local suffix (``5.26.0.dev0``, ``+cpu``) is
    dropped."""
    release = version.split("+")[0].split("rc")[0].split(".dev")[0]
    return tuple(int(p) for p in re.findall(r"\d+", release)[:3])


def installed(package: str) -> str | None:
    """The installed version of ``package``, or None when it is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def at_least(package: str, version: str) -> bool:
    """Whether the installed ``package`` is ``version`` or newer (False when it is not installed)."""
    have = installed(package)
    return have is not None and parse(have) >= parse(version)


def check_versions(*packages: str) -> None:
    """Refuse (or with :data:`OVERRIDE`, warn about) an installed package outside :data:`TESTED`.

    Args:
        *packages: names from :data:`TESTED`; a package that is not installed is not checked
            (the code that imports it says which extra brings it).

    Raises:
        UntestedVersion: one line naming the package, its version, the tested range and the override.
    """
    for package in packages:
        lowest, bound = TESTED[package]
        have = installed(package)
        if have is None or parse(lowest) <= parse(have) < parse(bound):
            continue
        wanted = f"{package}>={lowest},<{bound}"
        line = (f"{package} {have} is outside the range vlmcp was tested with ({wanted}): "
                f"pip install '{wanted}'")
        if os.environ.get(OVERRIDE) == "1":
            if (package, have) not in _WARNED:
                _WARNED.add((package, have))
                print(f"vlmcp: warning: {line} ({OVERRIDE}=1: going on)", file=sys.stderr, flush=True)
            continue
        raise UntestedVersion(f"{line}, or set {OVERRIDE}=1 to try it")
