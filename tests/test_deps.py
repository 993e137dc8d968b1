"""The tested ranges of the Hugging Face stack (issue 31): one table, stated alike everywhere, checked
at start-up in one line before any rank starts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from vlmcp import deps

ROOT = Path(__file__).resolve().parents[1]


def _pins(name: str) -> dict[str, str]:
    text = (ROOT / "requirements" / name).read_text()
    return {m[1].lower(): m[2] for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)$", text, flags=re.M)}


def test_pyproject_states_the_tested_ranges_in_every_extra():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    seen = {}
    for extra, requirements in extras.items():
        for req in requirements:
            name = re.match(r"[A-Za-z0-9_.-]+", req)[0]
            if name in deps.TESTED:
                lowest, bound = deps.TESTED[name]
                assert req == f"{name}>={lowest.removesuffix('.0')},<{bound}", (extra, req)
                seen[name] = extra
    assert set(seen) == set(deps.TESTED)  # each tested package is some extra's


def test_ci_pins_the_newest_tested_and_lowest_pins_the_lowest():
    ci, lowest = _pins("ci.txt"), _pins("lowest.txt")
    assert set(lowest) == set(deps.TESTED)
    for name, (low, bound) in deps.TESTED.items():
        assert deps.parse(lowest[name]) == deps.parse(low), name
        assert deps.parse(low) <= deps.parse(ci[name]) < deps.parse(bound), (name, ci[name])
    assert "torch" not in ci  # requirements/cpu.txt pins the CPU wheel; GPU users bring their own


def test_parse_drops_local_and_pre_release_suffixes():
    assert deps.parse("5.25.0") == (5, 25, 0)
    assert deps.parse("2.13.0+cpu") == (2, 13, 0)
    assert deps.parse("5.26.0.dev0") == (5, 26, 0)
    assert deps.parse("5.26.0rc1") == (5, 26, 0)


def test_a_version_outside_the_range_is_refused_in_one_line(monkeypatch, capsys):
    versions = {"transformers": "5.26.0", "peft": "0.22.0", "trl": None, "accelerate": "1.14.2"}
    monkeypatch.setattr(deps, "installed", versions.get)
    monkeypatch.delenv(deps.OVERRIDE, raising=False)
    with pytest.raises(deps.UntestedVersion) as err:
        deps.check_versions("transformers")
    message = str(err.value)
    assert "\n" not in message
    assert message == ("transformers 5.26.0 is outside the range vlmcp was tested with "
                       "(transformers>=5.24.0,<5.26): pip install 'transformers>=5.24.0,<5.26', or set "
                       "VLMCP_ALLOW_UNTESTED_VERSIONS=1 to try it")
    with pytest.raises(deps.UntestedVersion, match="accelerate 1.14.2 is outside"):  # below the lowest
        deps.check_versions("peft", "trl", "accelerate")
    deps.check_versions("peft", "trl")  # in range, and not installed: nothing to say
    monkeypatch.setenv(deps.OVERRIDE, "1")
    deps.check_versions("transformers")
    deps.check_versions("transformers")
    warned = capsys.readouterr().err.splitlines()
    assert len(warned) == 1 and warned[0].startswith("vlmcp: warning: transformers 5.26.0 is outside")


def test_the_installed_stack_is_in_range():
    deps.check_versions(*deps.TESTED)  # what make test installed (requirements/ci.txt)


_FAKE = ("import importlib.metadata as m, sys; real = m.version; "
         "m.version = lambda p: '5.99.0' if p == 'transformers' else real(p); "
         "from vlmcp.cli import main; sys.exit(main(sys.argv[1:]))")


@pytest.mark.parametrize("argv", [["verify", "--model", "hf:qwen2_vl", "--cp", "2"],
                                  ["init-model", "--arch", "qwen2_vl", "--out", "{tmp}/m"]])
def test_the_command_line_refuses_before_any_rank_starts(tmp_path, argv):
    argv = [a.format(tmp=tmp_path) for a in argv]
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", _FAKE, *argv], capture_output=True, text=True, timeout=120,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"vlmcp {argv[0]}: error: transformers 5.99.0 is outside the range"), lines
    assert "VLMCP_ALLOW_UNTESTED_VERSIONS=1" in lines[0]
    assert not (tmp_path / "m").exists()


def test_the_reference_model_needs_no_tested_transformers(tmp_path):
    """Without --model nothing reads transformers: an untested release does not stop the reference VLM."""
    proc = subprocess.run([sys.executable, "-c", _FAKE, "plan", "--cp", "2"], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert proc.returncode == 0 and "outside the range" not in proc.stderr, proc.stderr
