"""Atomic checkpoints: round trip, keep-last, crashes mid-write, RNG state."""

import os
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from vlmcp.train import (
    capture_rng_state,
    checkpoint_path,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
    restore_rng_state,
    save_checkpoint,
)

pytestmark = pytest.mark.timeout(60)


def _training_state(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


def _state(model, opt, step):
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": capture_rng_state(),
            "data_position": 17 * step, "config": {"cp": 2, "seq_len": 256, "name": "demo"}}


def test_round_trip_model_optimizer_and_metadata(tmp_path):
    model, opt = _training_state()
    path = save_checkpoint(tmp_path, 5, _state(model, opt, 5))
    assert path == checkpoint_path(tmp_path, 5) == tmp_path / "step_00000005.pt"
    ckpt = load_checkpoint(path)  # weights_only=True: the state must be plain data
    assert ckpt.step == 5 and ckpt.path == path
    assert ckpt.state["data_position"] == 85 and ckpt.state["config"]["name"] == "demo"
    fresh, fresh_opt = _training_state(seed=1)
    fresh.load_state_dict(ckpt.state["model"])
    fresh_opt.load_state_dict(ckpt.state["optimizer"])
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], fresh_opt.state_dict()["state"][0]["exp_avg"])


def test_latest_and_keep_last(tmp_path):
    assert latest_checkpoint(tmp_path / "missing") is None
    assert load_latest_checkpoint(tmp_path) is None
    for step in (1, 2, 3, 10, 11):
        save_checkpoint(tmp_path, step, {"step": step}, keep_last=3)
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "step_00000003.pt", "step_00000010.pt", "step_00000011.pt"]
    assert latest_checkpoint(tmp_path).name == "step_00000011.pt"  # numeric, not just lexical
    save_checkpoint(tmp_path, 12, {}, keep_last=None)
    assert len(list_checkpoints(tmp_path)) == 4


def test_exception_mid_write_leaves_last_good_checkpoint(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 1, {"value": torch.ones(3)})

    def broken_save(obj, f):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, {"value": torch.zeros(3)})
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001.pt"]  # no temp left
    assert torch.equal(load_checkpoint(latest_checkpoint(tmp_path)).state["value"], torch.ones(3))


def test_process_killed_mid_write_never_shadows_the_last_good_one(tmp_path):
    # The child dies (no cleanup, no exception handlers) after writing the data and
    # before the rename, as a SIGKILL or power cut would leave it.
    child = textwrap.dedent(f"""
        import os, torch
        from vlmcp.train import save_checkpoint
        save_checkpoint({str(tmp_path)!r}, 1, {{"value": torch.ones(3)}})
        os.fsync = lambda fd: os._exit(9)
        save_checkpoint({str(tmp_path)!r}, 2, {{"value": torch.zeros(1000)}})
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=60)
    assert proc.returncode == 9, proc.stderr.decode()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert len(leftovers) == 1 and leftovers[0].startswith(".step_00000002.pt.tmp-")
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000001.pt"
    assert torch.equal(load_checkpoint(latest_checkpoint(tmp_path)).state["value"], torch.ones(3))
    save_checkpoint(tmp_path, 2, {"value": torch.zeros(2)})  # the next save clears the debris
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001.pt", "step_00000002.pt"]


def test_damaged_checkpoint_falls_back_to_the_previous_one(tmp_path):
    save_checkpoint(tmp_path, 1, {"value": 1})
    newest = save_checkpoint(tmp_path, 2, {"value": 2})
    newest.write_bytes(newest.read_bytes()[:50])
    with pytest.raises(ValueError, match="cannot read checkpoint"):
        load_checkpoint(newest)
    with pytest.warns(UserWarning, match="skipping unreadable checkpoint"):
        ckpt = load_latest_checkpoint(tmp_path)
    assert ckpt.step == 1 and ckpt.state["value"] == 1


def test_rejects_foreign_files_and_bad_arguments(tmp_path):
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.ones(1)}, other)
    with pytest.raises(ValueError, match="not a vlmcp checkpoint"):
        load_checkpoint(other)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "nope.pt")
    with pytest.raises(ValueError, match="step"):
        save_checkpoint(tmp_path, -1, {})
    with pytest.raises(ValueError, match="keep_last"):
        save_checkpoint(tmp_path, 1, {}, keep_last=0)
    with pytest.raises(TypeError, match="mapping"):
        save_checkpoint(tmp_path, 1, [1, 2])


def _draw():
    return (random.random(), random.getrandbits(64), np.random.rand(3).tolist(),
            np.random.randn(), torch.rand(4).tolist(), torch.randint(0, 1000, (3,)).tolist())


def test_rng_round_trip_through_a_checkpoint(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.randn()  # leaves a cached gaussian in numpy's state
    save_checkpoint(tmp_path, 1, {"rng": capture_rng_state()})
    expected = _draw()
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    assert _draw() != expected
    restore_rng_state(load_checkpoint(latest_checkpoint(tmp_path)).state["rng"])
    assert _draw() == expected


def test_temp_files_do_not_match_checkpoint_names(tmp_path):
    save_checkpoint(tmp_path, 3, {})
    (tmp_path / ".step_00000009.pt.tmp-123").write_bytes(b"partial")
    (tmp_path / "step_00000009.pt.partial").write_bytes(b"x")
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000003.pt"
    assert os.path.exists(tmp_path / ".step_00000009.pt.tmp-123")
