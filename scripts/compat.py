"""``make compat`` / ``make compat-lowest``: the test suite against other releases of the Hugging Face stack.

``newest`` installs the registry's newest transformers, peft, trl and accelerate (ignoring the upper
bounds of pyproject.toml: the point is to try the release that is not in the range yet);
``lowest`` installs the lowest releases of the ranges (requirements/lowest.txt). Either gets its
own virtual environment (``.venv-compat-newest``, ``.venv-compat-lowest``) with the pinned CPU
torch, prints the versions it got, and runs the suite without the install check, with
``VLMCP_ALLOW_UNTESTED_VERSIONS=1`` so that a newer release is tried rather than refused.

When ``newest`` passes on a new minor release: raise the bounds in ``vlmcp/deps.py`` and
``pyproject.toml`` (tests/test_deps.py holds them together) and regenerate requirements/ci.txt.

Usage: ``python scripts/compat.py newest|lowest [pytest arguments]``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _deps():
    """``vlmcp/deps.py`` by its path: this runs on the system Python, which has no torch for ``vlmcp``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("vlmcp_deps", ROOT / "vlmcp" / "deps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_DEPS = _deps()
OVERRIDE, TESTED, parse = _DEPS.OVERRIDE, _DEPS.TESTED, _DEPS.parse


def _run(*argv, **kwargs) -> None:
    print("+", " ".join(map(str, argv)), flush=True)
    subprocess.run([str(a) for a in argv], check=True, **kwargs)


def _test_requirements(newest: bool) -> list[str]:
    """The test extra's requirements; with ``newest``, the tested packages without their bounds."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    out = []
    for req in extras["test"]:
        name = re.match(r"[A-Za-z0-9_.-]+", req)[0]
        out.append(name if newest and name in TESTED else req)
    return out


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("newest", "lowest"):
        print(__doc__, file=sys.stderr)
        return 2
    which, pytest_args = argv[0], argv[1:]
    venv = ROOT / f".venv-compat-{which}"
    python = venv / "bin" / "python"
    if not python.exists():
        _run(sys.executable, "-m", "venv", venv)
    pip = [python, "-m", "pip", "install", "-q"]
    _run(*pip, "-r", ROOT / "requirements" / "cpu.txt")
    if which == "newest":
        _run(*pip, "--upgrade", *_test_requirements(newest=True))
    else:
        _run(*pip, "-c", ROOT / "requirements" / "lowest.txt", *_test_requirements(newest=False))
    _run(*pip, "--no-deps", "-e", ROOT)
    code = f"import importlib.metadata as m; print(' '.join(m.version(p) for p in {list(TESTED)!r}))"
    versions = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    for name, version in zip(TESTED, versions, strict=True):
        lowest, bound = TESTED[name]
        inside = parse(lowest) <= parse(version) < parse(bound)
        print(f"{name} {version}: {'inside' if inside else 'OUTSIDE'} the tested range >={lowest},<{bound}",
              flush=True)
    env = {**os.environ, OVERRIDE: "1"}
    return subprocess.run([python, "-m", "pytest", "-q", "-m", "not install", *pytest_args], cwd=ROOT,
                          env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
