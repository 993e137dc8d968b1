"""Runs that survive faults (issue 19): each fault reproduced, and what must happen instead.

NaN inputs stay NaN in every attention backend; checkpoints are checksummed and fall back
to the previous good one; one run per directory; the final model is a checkpoint too;
stalled ranks end the job within ``--timeout``; ranks never outlive their launcher.
"""

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from tests import fault_cases
from vlmcp.attention import cp_attention, merge_, varlen_attention
from vlmcp.cli import main
from vlmcp.layout import plan_cp
from vlmcp.testing import DistributedTestError, run_on_ranks
from vlmcp.train.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from vlmcp.train.lock import RunLock, RunLocked, _proc_start

SMALL = ["--cp", "2", "--seq-len", "256", "--hidden", "32", "--layers", "1"]

pytestmark = pytest.mark.timeout(120)


# ---------------------------------------------------------------- NaN stays NaN


def test_merge_tells_a_row_without_keys_from_a_nan_row():
    out = torch.tensor([[[0.0, 0.0], [1.0, 2.0], [1.0, 2.0], [0.0, 0.0]]])
    lse = torch.tensor([[float("-inf"), 0.5, float("nan"), float("-inf")]])
    block_out = torch.tensor([[[0.0, 0.0], [float("nan")] * 2, [3.0, 4.0], [3.0, 4.0]]])
    block_lse = torch.tensor([[float("-inf"), float("nan"), 0.1, 0.2]])
    merge_(out, lse, block_out, block_lse)
    # no key on either side: still 0 and -inf; a NaN on either side: NaN; a new key: copied
    assert out[0, 0].tolist() == [0.0, 0.0] and bool(lse[0, 0].isneginf())
    assert bool(out[0, 1:3].isnan().all()) and bool(lse[0, 1:3].isnan().all())
    assert out[0, 3].tolist() == [3.0, 4.0] and float(lse[0, 3]) == pytest.approx(0.2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("kernel", ["flash_cpu", "math"])
def test_nan_stays_nan_in_one_process(dtype, kernel):
    """varlen_attention and cp_attention with P = 1 (ring and Ulysses) against the NaN rule."""
    for spot in fault_cases.NAN_SPOTS:
        is_image, cu, ids, q, k, v, affected = fault_cases.nan_inputs(spot, dtype)
        out, lse = varlen_attention(q, k, v, cu, kernel=kernel)
        everywhere = torch.arange(is_image.numel())
        fault_cases.check_nan_output(out, lse, everywhere, spot, is_image, cu, ids, q, k, v, affected)
        shard = plan_cp(is_image, 1, cu, image_ids=ids).for_rank(0)
        for backend in ("ring", "ulysses"):
            out, lse = cp_attention(shard.shard(q), shard.shard(k), shard.shard(v), shard, None, backend,
                                    return_lse=True, kernel=kernel)
            fault_cases.check_nan_output(out, lse, shard.positions, spot, is_image, cu, ids, q, k, v,
                                         affected)


def test_nan_stays_nan_in_every_cp_backend():
    results = run_on_ranks(fault_cases.nan_grid, 4, ("float32", "bfloat16"), timeout=110)
    assert [checked for checked, _ in results] == [5 * 2 * len(fault_cases.NAN_SPOTS)] * 4
    # the world waits 110 s (the spawn's timeout); every subgroup vlmcp made of it waits as
    # long (dist.new_group without timeout= would wait torch's default, 1800 s)
    assert [timeouts for _, timeouts in results] == [[110.0] * 5] * 4


# ---------------------------------------------------------------- integrity


def _losses(path):
    return [json.loads(line)["loss"] for line in open(path)]


def flip_a_tensor_bit(path):
    """Flip one bit in the middle of the largest tensor of a ``torch.save`` zip (torch does not
    check the zip's CRCs, so the file still loads: only the checksum can tell)."""
    with zipfile.ZipFile(path) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    raw = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    raw[info.header_offset + 30 + name_len + extra_len + info.file_size // 2] ^= 0x10
    path.write_bytes(bytes(raw))


def test_a_bit_flip_falls_back_to_the_previous_checkpoint_and_resume_is_exact(tmp_path, capsys):
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    run = ["train", *SMALL, "--steps", "6", "--checkpoint-every", "2", "--checkpoint-dir", str(ckpt),
           "--metrics-jsonl", str(metrics)]
    assert main(run) == 0
    full = _losses(metrics)
    newest = ckpt / "step_00000006.pt"
    flip_a_tensor_bit(newest)
    with pytest.raises(ValueError, match="step_00000006.pt is damaged: its contents do not match"):
        load_checkpoint(newest)
    capsys.readouterr()
    assert main([*run, "--resume"]) == 0
    out, err = capsys.readouterr()
    assert f"vlmcp train: warning: skipping unreadable checkpoint: checkpoint {newest} is damaged" in err
    assert "resuming from" in out and "step_00000004.pt (step 4 of 6)" in out
    assert _losses(metrics) == full  # steps 5 and 6 again, bit-exact on CPU
    # every checkpoint damaged: an error, never a fresh start over them
    for path in list_checkpoints(ckpt):
        flip_a_tensor_bit(path)
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    assert main([*run, "--resume"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("vlmcp train: error: --resume: none of the 3 checkpoint(s) in"), lines
    assert sum("skipping unreadable checkpoint" in line for line in lines) == 3 and len(lines) == 4
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before  # nothing touched


def test_dcp_checkpoints_are_checksummed_and_fall_back(tmp_path):
    from vlmcp.cli.train import resume_preflight
    from vlmcp.train.checkpoint.run import latest_step

    sums = run_on_ranks(fault_cases.dcp_round, 2, str(tmp_path), "save", timeout=100)[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001", "step_00000002"]
    shard = sorted((tmp_path / "step_00000002").glob("*.distcp"))[0]
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match=f"{shard} is damaged"):
        assert latest_step(tmp_path, fsdp=True)[0] == 1
    # the ranks resume from step 1, exactly
    assert run_on_ranks(fault_cases.dcp_round, 2, str(tmp_path), "load", timeout=100)[0] == (1, sums[0])
    (tmp_path / "step_00000001" / "vlmcp_meta.pt").write_bytes(b"garbage")
    with pytest.warns(UserWarning) as caught:
        assert latest_step(tmp_path, fsdp=True) is None
    assert [str(w.message).split(": ")[1] for w in caught] == [f"{shard} is damaged", "cannot read "
                                                               f"{tmp_path}/step_00000001/vlmcp_meta.pt"]
    cfg = fault_cases.dcp_config(tmp_path, resume=True)
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="none of the 2 checkpoint"):
        resume_preflight(cfg)


def test_a_full_disk_is_one_clean_os_error(tmp_path, monkeypatch):
    import builtins
    import errno
    import io

    from vlmcp.train.checkpoint import durable

    class Full(io.FileIO):
        def write(self, b):
            raise OSError(errno.ENOSPC, "No space left on device")

    save_checkpoint(tmp_path, 1, {"w": torch.ones(3)})
    # the temporary file's writes fail (it is opened by vlmcp.train.checkpoint.durable.open_exclusive)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    monkeypatch.setattr(durable, "open", lambda p, mode, opener: Full(opener(p, flags), "wb"), raising=False)
    with pytest.raises(OSError) as info:
        save_checkpoint(tmp_path, 2, {"w": torch.zeros(100_000)})
    assert str(info.value) == (f"[Errno 28] cannot write checkpoint {tmp_path}/step_00000002.pt: "
                               "No space left on device")
    assert info.value.__suppress_context__  # no chained "unexpected pos" from torch's zip writer
    monkeypatch.setattr(durable, "open", builtins.open)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001.pt"]
    with pytest.raises(DistributedTestError) as failed:  # a rank's OSError is one line, not a traceback
        run_on_ranks(fault_cases.raise_os_error, 2, timeout=60)
    lines = str(failed.value).splitlines()
    assert lines[0] == "rank 1: OSError: [Errno 28] No space left on device: cannot write checkpoint " \
        "/x/step_00000002.pt", lines
    # rank 0, waiting in a barrier, may have lost rank 1 before the launcher stopped it: one line too
    lost = "rank 0: outside the step loop: barrier over ranks [0, 1] lost a peer"
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith(lost)), lines


# ---------------------------------------------------------------- one run per directory


@pytest.fixture
def other_run():
    """A live process that is not this one (the holder of a lock)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _lock_of(pid, host=None):
    return json.dumps({"pid": pid, "host": host or socket.gethostname(),
                       "started": "2026-12-01T00:00:00+00:00", "proc_start": _proc_start(pid)})


def test_a_second_run_in_the_same_directory_is_refused(tmp_path, other_run, capsys):
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "elsewhere" / "m.jsonl"
    ckpt.mkdir()
    (ckpt / ".vlmcp.lock").write_text(_lock_of(other_run.pid))
    run = ["train", *SMALL, "--steps", "2", "--checkpoint-dir", str(ckpt)]
    assert main(run) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--checkpoint-dir {ckpt} is in use by another run (pid {other_run.pid} on " \
        f"{socket.gethostname()}, started 2026-12-01T00:00:00+00:00)" in err[0], err
    (ckpt / ".vlmcp.lock").unlink()
    metrics.parent.mkdir()
    (metrics.parent / ".m.jsonl.lock").write_text(_lock_of(other_run.pid))  # the metrics file too
    assert main(["train", *SMALL, "--steps", "2", "--metrics-jsonl", str(metrics)]) == 2
    assert f"--metrics-jsonl {metrics} is in use by another run" in capsys.readouterr().err
    assert not metrics.exists()


def test_a_stale_lock_is_taken_over_and_another_host_is_respected(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    (tmp_path / ".vlmcp.lock").write_text(_lock_of(int(gone.stdout)))
    taking_over = f"taking over the lock of a run that no longer exists \\(pid {gone.stdout.strip()} "
    with pytest.warns(UserWarning, match=taking_over):
        lock = RunLock(tmp_path, "--output-dir").acquire()
    assert json.loads((tmp_path / ".vlmcp.lock").read_text())["pid"] == os.getpid()
    with pytest.raises(RunLocked, match="in use by another run"):  # even this process, a second time
        RunLock(tmp_path, "--output-dir").acquire()
    lock.release()
    assert not (tmp_path / ".vlmcp.lock").exists()
    (tmp_path / ".vlmcp.lock").write_text(_lock_of(int(gone.stdout), host="another-node"))
    with pytest.raises(RunLocked, match="pid .* on another-node"):  # cannot be checked from here
        RunLock(tmp_path, "--output-dir").acquire()


def test_of_runs_that_take_over_one_stale_lock_together_exactly_one_wins(tmp_path):
    """Four runs find the same stale lock at the same moment, 60 times over: exactly one gets it
    each time, and the file names that one (checking the pid, then deleting the file, let a second
    run delete the first one's fresh lock and take it too)."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    takers, rounds = 4, 60
    barrier, results = ctx.Barrier(takers + 1, timeout=60), ctx.Queue()
    procs = [ctx.Process(target=fault_cases.lock_taker, args=(tmp_path, barrier, results, rounds))
             for _ in range(takers)]
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    for p in procs:
        p.start()
    try:
        for round_ in range(rounds):
            (tmp_path / ".vlmcp.lock").write_text(_lock_of(int(gone.stdout)))  # stale: its run is gone
            barrier.wait()
            barrier.wait()
            won = [results.get(timeout=30) for _ in range(takers)]
            winners = [pid for r, pid, ok in won if ok]
            assert {r for r, _, _ in won} == {round_} and len(winners) == 1, (round_, won)
            assert json.loads((tmp_path / ".vlmcp.lock").read_text())["pid"] == winners[0]
            barrier.wait()
            barrier.wait()
            assert not (tmp_path / ".vlmcp.lock").exists()  # the winner released it
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def test_where_files_cannot_be_locked_a_stale_lock_is_refused_not_taken_over(tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")  # an NFS mount without a lock manager

    monkeypatch.setattr(fcntl, "flock", no_flock)
    lock = RunLock(tmp_path, "--output-dir").acquire()  # O_EXCL: a new file
    assert json.loads((tmp_path / ".vlmcp.lock").read_text())["pid"] == os.getpid()
    with pytest.raises(RunLocked, match="in use by another run"):
        RunLock(tmp_path, "--output-dir").acquire()
    lock.release()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    (tmp_path / ".vlmcp.lock").write_text(_lock_of(int(gone.stdout)))
    refused = "names a run that no longer exists .* cannot lock files, so it is not taken over; delete it"
    with pytest.raises(RunLocked, match=refused):
        RunLock(tmp_path, "--output-dir").acquire()


def test_temp_files_are_removed_only_by_their_owner(tmp_path, other_run):
    host = socket.gethostname()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    live = tmp_path / f".step_00000009.pt.tmp-{other_run.pid}-{host}"
    remote = tmp_path / f".step_00000009.pt.tmp-{gone}-another-node"
    dead = tmp_path / f".step_00000009.pt.tmp-{gone}-{host}"
    for p in (live, remote, dead):
        p.write_bytes(b"partial")
    save_checkpoint(tmp_path, 1, {"w": torch.ones(1)})
    assert live.exists() and remote.exists() and not dead.exists()


# ---------------------------------------------------------------- minor


def test_hf_resume_compares_resolved_paths(tmp_path, monkeypatch):
    from vlmcp.train.checkpoint.run import check_resumable

    monkeypatch.chdir(tmp_path)
    cfg = fault_cases.dcp_config(tmp_path)
    saved = {**cfg.to_dict(), "model": "model", "data": "./data.jsonl"}  # relative spellings
    check_resumable(saved, cfg, 1, tmp_path)
    with pytest.raises(ValueError, match="--data './data.jsonl' -> "):
        check_resumable(saved, fault_cases.dcp_config(tmp_path, data=str(tmp_path / "other.jsonl")), 1,
                        tmp_path)



def test_cp_cross_entropy_refuses_a_group_that_is_not_one():
    from vlmcp.loss import cp_cross_entropy

    with pytest.raises(TypeError, match="group must be a torch.distributed ProcessGroup.*got int 1"):
        cp_cross_entropy(torch.zeros(3, 5), torch.zeros(3, dtype=torch.long), 1)


# ---------------------------------------------------------------- the final model is a checkpoint too


def test_the_final_model_survives_a_sigterm_in_the_last_step_and_a_lost_save(tmp_path, capsys):
    pytest.importorskip("transformers")
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    from tests.train_cases import hf_rank
    from vlmcp.cli.train import resume_preflight
    from vlmcp.data.hf.export import export_shapes
    from vlmcp.debug.init_model import init_model
    from vlmcp.launch import spawn_ranks
    from vlmcp.train.specs.hf.config import HFTrainConfig
    from vlmcp.train.specs.hf.final_model import final_model_complete
    from vlmcp.train.specs.hf.launch import plan_data, preload_model_code

    model, data, out = init_model("llava", tmp_path / "llava"), export_shapes(tmp_path / "shapes", 8), \
        tmp_path / "out"
    cfg = HFTrainConfig(model=str(model), data=str(data), output_dir=str(out), seq_len=128, steps=2, cp=2,
                        timeout=60.0)
    preload_model_code(cfg.model)
    index = plan_data(cfg)
    summary = spawn_ranks(fault_cases.hf_sigterm_in_last_step, 2, cfg, index, timeout=150)[0]
    # the SIGTERM came in the last step: the run finishes it, checkpoints it and saves the model
    assert summary["stopped"] is None and summary["step"] == 2 and summary["model_dir"] == str(out)
    assert sorted(p.name for p in cfg.checkpoints.iterdir()) == ["step_00000002.pt"]
    assert final_model_complete(out, 2)
    AutoModelForImageTextToText.from_pretrained(out)
    weights = {k: v.clone() for k, v in load_file(out / "model.safetensors").items()}  # not the mmap
    # a save that died part way (a full disk, a kill): --resume writes the model again
    (out / "model.safetensors").unlink()
    (out / "model.safetensors").write_bytes(b"half a model")
    assert not final_model_complete(out, 2)
    resume = HFTrainConfig(**{**cfg.to_dict(), "resume": True})
    assert resume_preflight(resume)
    assert "is at step 2 = --steps, but the model in" in capsys.readouterr().out
    again = spawn_ranks(hf_rank, 2, resume, index, timeout=150)[0]
    assert again["start_step"] == 2 and again["losses"] == [] and again["model_dir"] == str(out)
    assert final_model_complete(out, 2)
    rewritten = load_file(out / "model.safetensors")
    assert weights.keys() == rewritten.keys() and all(torch.equal(weights[k], rewritten[k]) for k in weights)
    assert not resume_preflight(resume) and "nothing to do" in capsys.readouterr().out
    assert not [p.name for p in out.iterdir() if p.name.startswith(".model.tmp")]


# ---------------------------------------------------------------- stalls, orphans, SIGTERM


def _children(pid: int) -> list[int]:
    kids = []
    for stat in os.listdir("/proc"):
        if stat.isdigit():
            try:
                if int(open(f"/proc/{stat}/stat").read().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(stat))
            except (OSError, IndexError):
                pass
    return sorted(kids)


def _ranks_of(launcher: int) -> list[int]:
    """The rank processes of a ``vlmcp train`` launcher: children of its fork server, rank 0 first
    (forked first)."""
    server = [p for p in _children(launcher) if b"forkserver" in open(f"/proc/{p}/cmdline", "rb").read()]
    return _children(server[0]) if server else []


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _train_cli(*args, **popen) -> subprocess.Popen:
    """``vlmcp train`` of this checkout in a fresh process (2000 steps: it runs until stopped)."""
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return subprocess.Popen([sys.executable, "-m", "vlmcp", "train", *SMALL, "--steps", "2000",
                             *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": path}, **popen)


def _wait_for_steps(proc, metrics, n: int, seconds: float = 90) -> list[int]:
    """Wait until ``metrics`` holds ``n`` steps; returns the rank pids."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= n:
            return _ranks_of(proc.pid)
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"no {n} steps within {seconds}s: {proc.communicate()[1][-2000:]}")


def test_a_stalled_rank_ends_the_job_within_the_timeout(tmp_path):
    metrics = tmp_path / "m.jsonl"
    proc = _train_cli("--timeout", 10, "--metrics-jsonl", metrics)
    ranks = _wait_for_steps(proc, metrics, 2)
    assert len(ranks) == 2
    os.kill(ranks[1], signal.SIGSTOP)  # rank 1 stops answering, mid-run
    start = time.monotonic()
    try:
        _, err = proc.communicate(timeout=10 + 30)
    finally:
        proc.kill()
        for pid in ranks:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert time.monotonic() - start < 10 + 15  # the run's --timeout, plus a few seconds
    assert proc.returncode == 1
    lines = [line for line in err.splitlines() if line.startswith("vlmcp")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    want = (r"vlmcp train: failed: rank 0: step \d+: .+ (over|with) ranks \[[01, ]+\] timed out "
            r"\(waited --timeout for ranks \[1\]\); no answer from rank 1 \(stopped\)")
    assert re.fullmatch(want, lines[0]), lines
    time.sleep(1)
    assert not any(_alive(p) for p in ranks)


def test_a_killed_rank_is_one_line_per_rank_not_a_gloo_traceback(tmp_path):
    metrics = tmp_path / "m.jsonl"
    proc = _train_cli("--metrics-jsonl", metrics)
    ranks = _wait_for_steps(proc, metrics, 2)
    assert len(ranks) == 2
    os.kill(ranks[1], signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1 and "Traceback" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert lines[0] == "vlmcp train: failed: rank 1 was killed by SIGKILL (signal 9) without a report", lines
    want = (r"vlmcp train: failed: rank 0: step \d+: .+ (over|with) ranks \[[01, ]+\] lost a peer "
            r"\((Connection reset by peer|Connection closed by peer|Broken pipe|Socket closed)\)")
    assert len(lines) == 2 and re.fullmatch(want, lines[1]), lines
    time.sleep(1)
    assert not any(_alive(p) for p in ranks)


def test_ranks_do_not_outlive_a_killed_launcher(tmp_path):
    metrics = tmp_path / "m.jsonl"
    proc = _train_cli("--metrics-jsonl", metrics)
    ranks = _wait_for_steps(proc, metrics, 1)
    assert len(ranks) == 2
    proc.kill()  # SIGKILL: no handler, no cleanup in the launcher
    proc.communicate()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in ranks):
        time.sleep(0.1)
    assert not any(_alive(p) for p in ranks)


@pytest.mark.parametrize("kind, rc", [("SIGTERM", 0), ("SIGINT", 130)])
def test_sigterm_on_the_reference_path_finishes_the_step_saves_and_exits_0(tmp_path, kind, rc):
    """SIGTERM to the launcher (it forwards it to every rank), or Ctrl-C (SIGINT to the whole process
    group, as a terminal sends it): the step finishes, a checkpoint is saved; Ctrl-C exits 130."""
    metrics, ckpt = tmp_path / "m.jsonl", tmp_path / "ckpt"
    proc = _train_cli("--metrics-jsonl", metrics, "--checkpoint-dir", ckpt, start_new_session=True)
    _wait_for_steps(proc, metrics, 2)
    if kind == "SIGTERM":
        proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == rc, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    done = len(_losses(metrics))
    assert f"vlmcp train: {kind}: stopped after step {done} of 2000, checkpoint step_{done:08d}.pt; " \
        "continue with --resume" in out
    assert [p.name for p in list_checkpoints(ckpt)] == [f"step_{done:08d}.pt"]
    assert load_checkpoint(ckpt / f"step_{done:08d}.pt").state["data_position"] > 0
    assert not (ckpt / ".vlmcp.lock").exists()  # released
