"""The names DESIGN.md section 5 promises, at the top of the package, with their signatures."""

import inspect
import subprocess
import sys

import vlmcp


def test_design_contract_names():
    assert list(inspect.signature(vlmcp.plan_cp).parameters)[:4] == [
        "is_image", "cp_size", "cu_seqlens", "image_strategy"]
    assert inspect.signature(vlmcp.plan_cp).parameters["image_strategy"].default == "replicate"
    params = inspect.signature(vlmcp.cp_attention).parameters
    assert list(params)[:6] == ["q", "k", "v", "shard", "group", "backend"]
    assert params["backend"].default == "ring"
    for name in vlmcp.__all__:
        assert getattr(vlmcp, name) is not None


def test_cli_has_the_design_subcommands():
    out = subprocess.run([sys.executable, "-m", "vlmcp", "--help"], capture_output=True, text=True,
                         timeout=120).stdout
    for command in ("train", "verify", "plan", "bench", "compare"):
        assert command in out
