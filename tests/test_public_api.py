"""The names DESIGN.md section 5 promises, at the top of the package, with their signatures."""

import inspect
import subprocess
import sys

import pytest

import vlmcp


def test_design_contract_names():
    assert list(inspect.signature(vlmcp.plan_cp).parameters)[:4] == [
        "is_image", "cp_size", "cu_seqlens", "image_strategy"]
    plan_params = inspect.signature(vlmcp.plan_cp).parameters
    assert plan_params["image_strategy"].default == "replicate"
    # beyond the contract: image identity (issue 9) and whole-sample placement (issue 12)
    assert plan_params["image_ids"].default is None and plan_params["sample_placement"].default == "split"
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


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True)
    return set(out.stdout.split())


def test_the_hf_runtime_imports_no_tooling():
    """``import vlmcp.hf`` (what training runs) loads none of the tiny configs, synthetic rows, float64
    patches, parity harness, meters or init-model writers (vlmcp.debug)."""
    pytest.importorskip("transformers")
    loaded = _modules_after("import vlmcp.hf")
    assert "vlmcp.hf.parallel" in loaded and "vlmcp.hf.inputs" in loaded
    tooling = sorted(m for m in loaded if m.startswith("vlmcp.debug"))
    assert tooling == []


def test_the_five_vision_modes_are_written_once():
    """vlmcp.vision.modes runs every mode's collective; the reference placement and the HF wrapper call
    it and run none of their own."""
    import inspect as _inspect

    import vlmcp.vision.modes
    import vlmcp.vision.placement

    engine = _inspect.getsource(vlmcp.vision.modes)
    assert all(call in engine for call in ("broadcast(", "all_gather(", "dist.all_reduce("))
    callers = [vlmcp.vision.placement]
    if importlib_find("transformers"):
        import vlmcp.hf.vision_placement

        callers.append(vlmcp.hf.vision_placement)
    for module in callers:
        source = _inspect.getsource(module)
        assert "placed_features(" in source, module.__name__
        own = [call for call in ("broadcast(", "all_gather(", "all_reduce(") if call in source]
        assert own == [], module.__name__


def importlib_find(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
