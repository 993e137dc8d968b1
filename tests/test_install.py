"""The install check: a plain install, in a fresh venv, runs the main job (issue 8).

A fresh virtual environment that does not see the development one's packages gets the
pinned CPU torch of ``requirements/cpu.txt`` and a copy of this checkout installed
without extras, the way a user runs ``pip install vlmcp``. Then ``vlmcp train``
(2 steps, with ``--metrics-jsonl``) and ``vlmcp plan --out`` must exit 0 and leave
valid PNGs. A runtime dependency that only an extra (e.g. ``test``) happens to bring
fails here. Then the same venv gets ``pip install 'vlmcp[hf]'`` and the Python example of
``docs/training.md`` (the block that loads ``runs/hf/out``) runs verbatim on a model from
``vlmcp init-model`` and an image from ``vlmcp data shapes``. It takes about two minutes
(most of it unpacking torch; pip's cache is reused); ``pytest -m "not install"`` leaves
it out of a quick local run, and ``make test`` (CI) runs it.
"""

import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.install, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _run(argv, cwd, timeout):
    # No PYTHONPATH or user site: only the fresh venv's packages may be importable.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, argv))} exited {proc.returncode}:\n{proc.stderr}"
    return proc.stdout


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR", f"{path}: no IHDR chunk first"
    return struct.unpack(">II", data[16:24])


def readme_hf_example() -> str:
    """docs/training.md's Python block that loads the trained HF model (run as written)."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "training.md").read_text(), flags=re.S)
    found = [b for b in blocks if 'from_pretrained("runs/hf/out")' in b]
    assert len(found) == 1, f"docs/training.md has {len(found)} Python blocks that load runs/hf/out"
    return found[0]


def test_a_plain_install_trains_and_draws(tmp_path):
    # Install a copy, so that the build writes nothing into the checkout.
    src = tmp_path / "src"
    shutil.copytree(ROOT / "vlmcp", src / "vlmcp", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, 120)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    # This pip installs into the fresh venv (--python), which saves bootstrapping its own;
    # torch is pinned in the same resolve, so pip never picks an unpinned (CUDA) build;
    # --no-compile: torch's thousands of .pyc files are not needed to run
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile",
          "-r", ROOT / "requirements" / "cpu.txt", src], tmp_path, 600)

    work = tmp_path / "user"
    work.mkdir()
    where = _run([python, "-c", "import vlmcp, importlib.util as u; "
                  "print(vlmcp.__file__, u.find_spec('pytest') is None)"], work, 60).split()
    assert Path(where[0]).is_relative_to(venv), f"vlmcp imported from {where[0]}, not the fresh venv"
    assert where[1] == "True", "the fresh venv sees pytest: it is not isolated from the dev venv"
    _run([bin_dir / "vlmcp", "train", "--cp", "2", "--steps", "2", "--seq-len", "256", "--hidden", "32",
          "--layers", "1", "--metrics-jsonl", "runs/m.jsonl"], work, 300)
    _run([bin_dir / "vlmcp", "plan", "--cp", "4", "--out", "runs/plan.png"], work, 120)

    import matplotlib.image

    for png in (work / "runs" / "m.png", work / "runs" / "plan.png"):
        width, height = _png_size(png)
        assert width > 100 and height > 100, f"{png} is {width}x{height}"
        assert matplotlib.image.imread(png).shape[:2] == (height, width)  # decodes in full

    # pip install 'vlmcp[hf]': docs/training.md's Python example as written (the model it loads is a
    # fresh init-model directory rather than 300 trained steps; the files are the same kind)
    # with CI's constraints: the versions make test installed, not whatever the registry has today
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile",
          "-r", ROOT / "requirements" / "cpu.txt", "-c", ROOT / "requirements" / "ci.txt", f"{src}[hf]"],
         tmp_path, 600)
    _run([bin_dir / "vlmcp", "init-model", "--arch", "qwen2_vl", "--out", "runs/hf/out"], work, 120)
    _run([bin_dir / "vlmcp", "data", "shapes", "--out", "runs/hf/data", "--samples", "2"], work, 120)
    example = work / "readme_example.py"
    example.write_text(readme_hf_example())
    printed = _run([python, example], work, 300)
    assert printed.endswith("\n"), "the docs/training.md example did not reach its print"
