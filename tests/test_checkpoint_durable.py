"""Checkpoints that no crash, full disk or planted link can corrupt (issue 31, item 4).

The FSDP save is atomic and durable: a crash between any two of its file operations leaves a
loadable newest checkpoint (Note [vlmcp DCP checkpoints: atomic and durable]); every file and
directory is fsynced before a name points at it. Temporary files are created with
``O_EXCL | O_NOFOLLOW``. A full disk is one line, also inside safetensors' Rust writer.
"""

import os
import re
import shutil
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from tests import fault_cases
from vlmcp.testing import DistributedTestError, run_on_ranks
from vlmcp.train.checkpoint import durable, load_checkpoint, payload_digest, save_checkpoint
from vlmcp.train.checkpoint.durable import clean_os_error, remove_stale_temps

pytestmark = pytest.mark.timeout(150)


class _Crash(BaseException):
    """The process dies here (no handler of the code under test catches a BaseException)."""


def _crash_at(monkeypatch, k: int, log: list):
    """Make the ``k``-th file operation (rename or delete; 0 = the first) of the code under test
    crash: a rename before it happens, a directory's deletion half way (one file gone); every
    operation is logged."""
    real_replace, real_rmtree, real_unlink = os.replace, shutil.rmtree, Path.unlink

    def op(name, real):
        def run(*args, **kwargs):
            if len(log) == k:
                files = sorted(p for p in Path(args[0]).rglob("*") if p.is_file()) if name == "rmtree" else []
                if files:
                    real_unlink(files[0])
                raise _Crash(name)
            log.append((name, *map(str, args[:2])))
            return real(*args, **kwargs)
        return run

    monkeypatch.setattr(os, "replace", op("replace", real_replace))
    monkeypatch.setattr(shutil, "rmtree", op("rmtree", real_rmtree))
    monkeypatch.setattr(Path, "unlink", op("unlink", real_unlink))


def _next_save(template: Path, where: Path, step: int):
    """``where``: a copy of ``template`` (steps 1 and 2) with step ``step``'s save about to be
    published: its complete temporary directory (the files of step 2) and its meta."""
    from vlmcp.train.checkpoint.dcp import META, file_sha256
    from vlmcp.train.lock import writer_tag

    shutil.copytree(template, where)
    temp = where / f".step_{step:08d}.tmp-{writer_tag()}"
    shutil.copytree(where / "step_00000002", temp)
    meta = torch.load(temp / META, weights_only=True)
    (temp / META).unlink()
    meta = {k: v for k, v in meta.items() if k != "sha256"} | {"step": step}
    meta["files"] = {p.name: file_sha256(p) for p in sorted(temp.iterdir())}
    meta["sha256"] = payload_digest(meta)
    return temp, where / f"step_{step:08d}", meta


def test_a_crash_anywhere_in_a_dcp_save_leaves_a_loadable_newest_checkpoint(tmp_path, monkeypatch):
    from vlmcp.train.checkpoint.dcp import TEMP, publish_dcp
    from vlmcp.train.checkpoint.run import latest_step

    template = tmp_path / "saved"
    run_on_ranks(fault_cases.dcp_round, 2, str(template), "save", timeout=100)  # steps 1 and 2
    # a new step 3 (step 1 pruned: --save-total-limit 2), and step 2 saved again over a damaged one
    for step, keep, before, after in ((3, 2, {1, 2}, {2, 3}), (2, 2, {1, 2}, {1, 2})):
        k, done = 0, False
        while not done:
            where = tmp_path / f"s{step}-crash{k}"
            temp, final, meta = _next_save(template, where, step)
            log = []
            with monkeypatch.context() as patch:
                _crash_at(patch, k, log)
                try:
                    publish_dcp(temp, final, meta, keep)
                    done = True
                except _Crash:
                    pass
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # no visible checkpoint is damaged: none is skipped
                found = latest_step(where, fsdp=True)
            visible = {int(p.name[5:]) for p in where.iterdir() if p.name.startswith("step_")}
            assert found is not None and found[0] == max(visible), (step, k, log, visible)
            assert before - {step} <= visible | {1} and visible <= before | after, (step, k, log, visible)
            if done:
                assert visible == after and not [p for p in where.iterdir() if p.name.startswith(".")]
                assert len(log) == k and k >= 3, log  # saw every operation, crashing before each
            remove_stale_temps(where, TEMP)  # the next save of this writer removes the debris
            assert sorted(p.name for p in where.iterdir() if p.name.startswith(".")) == [], (step, k)
            k += 1


def test_a_dcp_save_fsyncs_every_file_and_directory_before_a_name_points_at_them(tmp_path, monkeypatch):
    from vlmcp.train.checkpoint.dcp import publish_dcp

    template = tmp_path / "saved"
    run_on_ranks(fault_cases.dcp_round, 2, str(template), "save", timeout=100)
    temp, final, meta = _next_save(template, tmp_path / "run", 3)
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(a), str(b))),
                                                     real_replace(a, b))[1])
    publish_dcp(temp, final, meta, 2)
    published = events.index(("replace", str(temp), str(final)))
    synced_before = {path for kind, path, *_ in events[:published] if kind == "fsync"}
    assert {str(temp / p.name) for p in final.iterdir()} | {str(temp)} <= synced_before, events
    assert ("fsync", str(final.parent)) in events[published:], events  # the rename itself
    assert "vlmcp_meta.pt" in {p.name for p in final.iterdir()}


def test_temporary_files_are_exclusive_and_never_written_through_a_link(tmp_path, monkeypatch):
    from vlmcp.train.specs.hf import final_model

    tag = f"{os.getpid()}-{socket.gethostname()}"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / f".step_00000001.pt.tmp-{tag}").symlink_to(victim)  # at the predictable temporary name
    save_checkpoint(ckpt, 1, {"w": torch.ones(3)})
    assert victim.read_text() == "precious" and load_checkpoint(ckpt / "step_00000001.pt").step == 1
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_00000001.pt"]
    # planted again at once (a race for the name): refused in one line, nothing written through
    real_unlink = Path.unlink

    def replant(self, *args, **kwargs):
        real_unlink(self, *args, **kwargs)
        if self.name.startswith(".step_00000002"):
            self.symlink_to(victim)

    (ckpt / f".step_00000002.pt.tmp-{tag}").symlink_to(victim)
    with monkeypatch.context() as patch:
        patch.setattr(Path, "unlink", replant)
        refused = r"^\[Errno 17\] cannot write checkpoint .*step_00000002\.pt: File exists$"
        with pytest.raises(OSError, match=refused):
            save_checkpoint(ckpt, 2, {"w": torch.ones(3)})
    assert victim.read_text() == "precious"
    # the final model's marker and the O_NOFOLLOW of every exclusive open
    out, temp = tmp_path / "out", tmp_path / "out" / f".model.tmp-{tag}"
    temp.mkdir(parents=True)
    (temp / "config.json").write_text("{}")
    (out / f".vlmcp_model.json.tmp-{tag}").symlink_to(victim)
    final_model._publish(temp, out, 7)
    assert victim.read_text() == "precious" and final_model.final_model_complete(out, 7)
    flags = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, f, *a: (flags.append(f), real_open(path, f, *a))[1])
    durable.open_exclusive(tmp_path / "new").close()
    assert flags and all(f & os.O_EXCL and f & os.O_NOFOLLOW and f & os.O_CREAT for f in flags)


def test_a_full_disk_in_safetensors_and_in_a_dcp_save_is_one_line(tmp_path):
    pytest.importorskip("transformers")
    from vlmcp.debug.init_model import init_model
    from vlmcp.train.specs.hf.config import HFTrainConfig

    # safetensors' writer is Rust: no OSError in the chain, the errno only in its message
    probe = subprocess.run([sys.executable, "-c", (
        "import sys, torch, safetensors.torch as st; sys.path.insert(0, sys.argv[1]); "
        "from tests.fault_cases import _file_size_limit; _file_size_limit(4096)\n"
        "try: st.save_file({'w': torch.zeros(10000)}, sys.argv[2])\n"
        "except Exception as e: print(type(e).__name__, e)"), str(Path(__file__).parents[1]),
        str(tmp_path / "w.safetensors")], capture_output=True, text=True, check=True).stdout.strip()
    assert probe == "SafetensorError Error while serializing: I/O error: File too large (os error 27)", probe
    err = type("SafetensorError", (Exception,), {})(
        "Error while serializing: I/O error: No space left on device (os error 28)")  # as on a full disk
    clean = clean_os_error(err, "the trained model to /out")
    assert (clean.errno, str(clean)) == (28, "[Errno 28] cannot write the trained model to /out: No space "
                                             "left on device")
    # the final model, on two ranks: rank 0's line, no traceback, nothing half written left
    model, out = init_model("llava", tmp_path / "llava"), tmp_path / "out"
    cfg = HFTrainConfig(model=str(model), data=str(tmp_path / "d.jsonl"), output_dir=str(out), seq_len=64,
                        steps=1, cp=2)
    with pytest.raises(DistributedTestError) as failed:
        run_on_ranks(fault_cases.final_model_full_disk, 2, cfg, timeout=120)
    assert failed.value.lines[0] == (f"rank 0: OSError: [Errno 27] cannot write the trained model to {out}: "
                                     "File too large"), failed.value.lines
    assert "Traceback" not in str(failed.value)
    assert sorted(p.name for p in out.iterdir()) == []  # no temporary directory, no marker
    # an FSDP checkpoint whose rank 1 cannot write its shard: one line, no visible step
    with pytest.raises(DistributedTestError) as failed:
        run_on_ranks(fault_cases.dcp_full_disk, 2, str(tmp_path / "dcp"), timeout=100)
    want = (rf"rank [01]: OSError: \[Errno 27\] cannot write checkpoint {tmp_path}/dcp/step_00000001: "
            "File too large")
    assert re.fullmatch(want, failed.value.lines[0]), failed.value.lines
    assert not [p for p in (tmp_path / "dcp").iterdir() if p.name.startswith("step_")]
