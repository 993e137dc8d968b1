"""A crafted checkpoint never runs code (issue 31, item 1).

torch's DCP reads ``.metadata`` with plain ``pickle`` and non-tensor items with
``torch.load(weights_only=False)``; the SHA-256 sums in ``vlmcp_meta.pt`` catch damage, not
tampering (whoever writes the folder recomputes them). Each payload here writes a marker file
when unpickled; the marker must never appear (Note [vlmcp DCP checkpoints are unpickled through
an allow-list]). And no load from disk anywhere in the package may unpickle freely (an ast scan).
"""

import ast
import importlib.util
import io
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import fault_cases
from vlmcp.cli import main
from vlmcp.testing import run_on_ranks
from vlmcp.train.checkpoint import payload_digest

pytestmark = pytest.mark.timeout(150)

ROOT = Path(__file__).resolve().parents[1]


class _Payload:
    """Unpickled, it writes ``marker`` (a stand-in for any code) and becomes None."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def _rehash(step_dir: Path) -> None:
    """Recompute ``vlmcp_meta.pt``'s checksums, as anyone who can write the folder can."""
    from vlmcp.train.checkpoint.dcp import META, file_sha256

    meta = torch.load(step_dir / META, weights_only=True)
    meta["files"] = {p.name: file_sha256(p) for p in sorted(step_dir.iterdir())
                     if p.is_file() and p.name != META}
    meta.pop("sha256")
    meta["sha256"] = payload_digest(meta)
    torch.save(meta, step_dir / META)


def _craft(saved: Path, where: Path, kind: str, marker: Path) -> Path:
    """A copy of step 1 of ``saved`` with a payload in its ``.metadata`` (``"metadata"``) or in the
    optimizer's ``lr`` item of a shard file (``"bytes"``), the checksums recomputed."""
    step = where / "step_00000001"
    shutil.copytree(saved / "step_00000001", step)
    metadata = pickle.loads((step / ".metadata").read_bytes())  # the genuine one, from our own save
    if kind == "metadata":  # still valid metadata: a load would go on as if nothing happened
        metadata.planner_data = {**metadata.planner_data, "x": _Payload(marker)}
    else:
        from torch.distributed.checkpoint.filesystem import _StorageInfo

        index = next(i for i in metadata.storage_data if i.fqn == "optimizer.param_groups.0.lr")
        info = metadata.storage_data[index]
        item = io.BytesIO()
        torch.save({"lr": _Payload(marker)}, item)
        shard = step / info.relative_path
        offset = shard.stat().st_size
        with open(shard, "ab") as f:
            f.write(item.getvalue())
        metadata.storage_data[index] = _StorageInfo(info.relative_path, offset, len(item.getvalue()))
    (step / ".metadata").write_bytes(pickle.dumps(metadata))
    _rehash(step)
    return step


def test_a_crafted_dcp_checkpoint_is_refused_on_every_rank_and_runs_nothing(tmp_path, capsys):
    from vlmcp.cli.train import resume_preflight
    from vlmcp.train.checkpoint.run import latest_step

    saved = tmp_path / "saved"
    run_on_ranks(fault_cases.dcp_round, 2, str(saved), "save", timeout=100)
    marker = tmp_path / "marker"
    crafted = {kind: _craft(saved, tmp_path / kind, kind, marker) for kind in ("metadata", "bytes")}
    # the payloads are live: torch's own readers run them (in another process, on copies that write
    # another marker)
    live = tmp_path / "live"
    probe = ("import io, sys, torch; from torch.distributed.checkpoint import FileSystemReader; "
             "md = FileSystemReader(sys.argv[1]).read_metadata(); "
             "s = next(s for i, s in md.storage_data.items() if i.fqn == 'optimizer.param_groups.0.lr'); "
             "f = open(sys.argv[1] + '/' + s.relative_path, 'rb'); f.seek(s.offset); "
             "torch.load(io.BytesIO(f.read(s.length)), weights_only=False)")  # DefaultLoadPlanner.load_bytes
    for kind in ("metadata", "bytes"):
        step = _craft(saved, tmp_path / f"live-{kind}", kind, live)
        subprocess.run([sys.executable, "-c", probe, str(step)], check=True, cwd=tmp_path)
        assert live.exists(), kind
        live.unlink()
    assert not marker.exists()
    # the command line refuses before any rank starts: one line naming the file
    metadata_line = (f"{crafted['metadata']}/.metadata: refused: it would unpickle builtins.exec, which a "
                     "DCP checkpoint never holds (a crafted checkpoint runs code when loaded); nothing was "
                     "loaded")
    with pytest.raises(ValueError) as info:
        resume_preflight(fault_cases.dcp_config(tmp_path / "metadata", resume=True))
    assert str(info.value) == metadata_line
    if importlib.util.find_spec("transformers") is not None:  # what the user sees: exit 2, that line
        from vlmcp.data.hf.export import export_shapes
        from vlmcp.debug.init_model import init_model

        model, data = init_model("llava", tmp_path / "llava"), export_shapes(tmp_path / "shapes", 4)
        assert main(["train", "--model", str(model), "--data", str(data), "--output-dir",
                     str(tmp_path / "out"), "--checkpoint-dir", str(tmp_path / "metadata"), "--fsdp",
                     "--resume", "--cp", "2", "--seq-len", "128", "--steps", "2"]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"vlmcp train: error: {metadata_line}"
    with pytest.raises(ValueError, match=r"\.distcp: item optimizer\.param_groups\.0\.lr: refused: "
                                         r"torch\.load\(weights_only=True\) does not read it"):
        latest_step(tmp_path / "bytes", fsdp=True)  # never skipped for an older one: refused
    # the ranks, bypassing the command line: every rank refuses, none waits for another
    results = run_on_ranks(fault_cases.dcp_refusals, 2, [str(crafted["metadata"].parent),
                                                         str(crafted["bytes"].parent)], timeout=100)
    for rank, (refused, inside) in enumerate(results):
        by_rank_0 = "rank 0 refused a checkpoint (its line names the file); nothing was loaded"
        assert refused[0] == metadata_line if rank == 0 else refused[0].endswith(by_rank_0), (rank, refused)
        assert ("optimizer.param_groups.0.lr: refused: torch.load(weights_only=True)" in refused[1]
                if rank == 0 else refused[1].endswith(by_rank_0)), (rank, refused)
        # past every check, dcp.load through the allow-list reader and planner refuses too
        assert "it would unpickle builtins.exec" in inside[0], (rank, inside)
        assert "refused: torch.load(weights_only=True) does not read it" in inside[1], (rank, inside)
    assert not marker.exists()


# ---------------------------------------------------------------- every load from disk, in the source


_UNPICKLERS = {("pickle", "load"), ("pickle", "loads"), ("pickle", "Unpickler"), ("marshal", "load"),
               ("marshal", "loads"), ("dill", "load"), ("dill", "loads"), ("joblib", "load"),
               ("cloudpickle", "load"), ("cloudpickle", "loads"), ("shelve", "open"), ("yaml", "load"),
               ("yaml", "unsafe_load"), ("yaml", "full_load"), ("jit", "load"), ("pd", "read_pickle"),
               ("pandas", "read_pickle")}
_ALLOWED_PICKLE = {("vlmcp/launch.py", "loads")}
"""The launcher's results from its own ranks (a pipe between this user's processes, not a file)."""


def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = (owner.id if isinstance(owner, ast.Name) else
                    owner.attr if isinstance(owner, ast.Attribute) else "")
            yield node, name, node.func.attr


def _keyword(node, key):
    return next((k.value for k in node.keywords if k.arg == key), None)


def test_no_load_from_disk_unpickles_freely():
    """Every torch.load says weights_only=True, np.load never allow_pickle=True, yaml only safe_load,
    no other unpickler but the launcher's own pipe, and every dcp.load goes through the allow-list."""
    found = []
    for path in sorted((ROOT / "vlmcp").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node, owner, attr in _calls(ast.parse(path.read_text(), rel)):
            where = f"{rel}:{node.lineno}"
            if (owner, attr) == ("torch", "load"):
                value = _keyword(node, "weights_only")
                if not (isinstance(value, ast.Constant) and value.value is True):
                    found.append(f"{where}: torch.load without weights_only=True")
            elif attr == "load" and owner in ("np", "numpy"):
                value = _keyword(node, "allow_pickle")
                if value is not None and not (isinstance(value, ast.Constant) and value.value is False):
                    found.append(f"{where}: np.load with allow_pickle")
            elif (owner, attr) in _UNPICKLERS and (rel, attr) not in _ALLOWED_PICKLE:
                found.append(f"{where}: {owner}.{attr}")
            elif (owner, attr) == ("dcp", "load"):
                if _keyword(node, "storage_reader") is None or _keyword(node, "planner") is None:
                    found.append(f"{where}: dcp.load without the allow-list storage_reader and planner")
    assert found == []


def test_the_scan_finds_what_it_looks_for(tmp_path):
    bad = ("import torch, pickle, yaml, numpy as np\n"
           "torch.load(f)\ntorch.load(f, weights_only=False)\npickle.load(f)\nyaml.load(s)\n"
           "np.load(f, allow_pickle=True)\ndcp.load(s, checkpoint_id=p)\n")
    calls = [(owner, attr) for _, owner, attr in _calls(ast.parse(bad))]
    assert calls == [("torch", "load"), ("torch", "load"), ("pickle", "load"), ("yaml", "load"),
                     ("np", "load"), ("dcp", "load")]
