"""Does vlmcp's CUDA path work? One command, a few minutes, a short report (``make gpu-check``).

1. The machine: torch, CUDA, NCCL, the GPUs, flash-attn, and which local kernel
   ``select_kernel`` picks for each dtype on CUDA.
2. The GPU-marked tests (``pytest -m gpu``): every CUDA kernel against the math kernel
   in float64 (fp32/bf16/fp16, every block kind, GQA, both ``out`` layouts, no host
   sync), single-process CP attention on CUDA, and NCCL ring/Ulysses parity through
   torchrun on every local GPU (``tests/test_cuda_review.py``), fla's gated delta rule
   kernel against the torch kernel when flash-linear-attention is installed, and the MoE
   experts' ``torch._grouped_mm`` kernel against the per-expert loop (``tests/test_hf_moe.py``).
3. The attention benchmark on CUDA (``vlmcp bench attention``'s row: 1,024 image +
   8,192 text tokens, 8 heads of 64, forward + backward): single-process time per
   kernel and dtype, then ring and Ulysses over all local GPUs (NCCL, torchrun):
   time per rank against one process, efficiency (single time x the rank's share of
   attended pairs / slowest rank), saved-for-backward bytes per rank.

Exit status 0 only when every test passed and every measurement ran; 2 when there is
no CUDA device (nothing was checked). ``--skip-tests`` / ``--skip-bench`` run one half.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's vlmcp and tests, also for the torchrun ranks
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}


def _row(image_tokens, text_tokens, heads, head_dim, dtype, device, seed=0):
    """One sample of ``image_tokens`` + ``text_tokens`` (as in ``vlmcp bench attention``)."""
    is_image = torch.arange(image_tokens + text_tokens) < image_tokens
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(is_image.numel(), heads, head_dim, generator=g).to(dtype).to(device)
                     for _ in range(4))
    return is_image, torch.tensor([0, is_image.numel()]), q, k, v, dout


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _time(fn, repeats):
    """Median wall time of ``fn()`` in seconds (CUDA synchronized around each call)."""
    fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def environment() -> list[str]:
    from vlmcp.attention import kernels as K

    n = torch.cuda.device_count()
    gpus = ", ".join(sorted({f"{torch.cuda.get_device_name(i)} (sm{''.join(map(str, K._capability_of(i)))})"
                             for i in range(n)}))
    nccl = torch.cuda.nccl.version() if dist.is_nccl_available() else "unavailable"
    nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)  # an int before torch 2.1
    fa = K.flash_attn_version()
    lines = [f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}; {n} x {gpus}",
             f"flash-attn: {'.'.join(map(str, fa)) if fa else 'not installed'}"
             f" (usable: {K.FlashAttnKernel.available()})"]
    picks = ", ".join(f"{name} -> {K.select_kernel('cuda', dt).name}" for name, dt in DTYPES.items())
    lines.append(f"kernel per dtype on CUDA: {picks}")
    cap = K._capability_of(torch.cuda.current_device())
    lines.append("flash-attn takes head_dim (bf16): " + ", ".join(
        f"{d}: {'yes' if K.flash_attn_supports(torch.bfloat16, d, cap, fa) else 'no (sdpa)'}"
        for d in (64, 128, 256, 264)))
    return lines


def run_tests(timeout: int) -> tuple[bool, list[str]]:
    """``pytest -m gpu`` on the CUDA tests; returns (passed, report lines)."""
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rfEs", "-p", "no:cacheprovider",
           "tests/test_cuda_review.py", "tests/test_attention_kernels.py", "tests/test_gdn_kernels.py",
           "tests/test_linear_cross_entropy.py", "tests/test_hf_moe.py"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, [f"GPU tests: did not finish within {timeout} s (a hang?)"]
    text = proc.stdout + proc.stderr
    summary = re.findall(r"^=*\s*(\d+ (?:passed|failed|errors?|skipped|deselected)\b.*? in [\d.]+s)",
                         text, re.M)
    lines = [f"GPU tests ({' '.join(cmd[3:])}): {summary[-1] if summary else 'no summary'}"]
    lines += ["  " + ln for ln in text.splitlines() if ln.startswith(("FAILED", "ERROR", "SKIPPED"))]
    ok = proc.returncode == 0 and "passed" in (summary[-1] if summary else "")
    if not ok and not summary:
        lines += ["  " + ln for ln in text.splitlines()[-30:]]
    return ok, lines


def bench_single(repeats: int) -> list[str]:
    """Single-process ``varlen_attention`` forward + backward per kernel and dtype (the math
    kernel is left out: at this length it needs tens of GiB)."""
    from vlmcp.attention import select_kernel, varlen_attention

    lines = []
    for dname, kernels in (("bfloat16", (None, "sdpa")), ("float16", (None, "sdpa")), ("float32", (None,))):
        dtype = DTYPES[dname]
        is_image, cu, q, k, v, dout = _row(1024, 8192, 8, 64, dtype, "cuda")
        x = [t.requires_grad_() for t in (q, k, v)]
        parts = []
        for name in kernels:
            def step(x=x, cu=cu, dout=dout, name=name, is_image=is_image):
                for t in x:
                    t.grad = None
                out = varlen_attention(*x, cu, is_image, kernel=name)[0]
                (out * dout).sum().backward()

            label = select_kernel("cuda", dtype, name).name + ("" if name else " (default)")
            parts.append(f"{label} {_time(step, repeats) * 1e3:.1f} ms")
        lines.append(f"  {dname}: " + ", ".join(parts))
    return ["single process, 1,024 image + 8,192 text tokens, 8 heads of 64, fwd+bwd:", *lines]


def bench_worker(path: str, repeats: int, dtype_name: str) -> None:
    """torchrun rank: ring and Ulysses on all GPUs against one process (rank 0), as the CPU benchmark.

    Without CUDA it runs on gloo and the CPU (a dry run of this script's own logic)."""
    import vlmcp
    from vlmcp.attention import cp_attention, varlen_attention
    from vlmcp.debug.meters.saved_tensors import SavedTensorMeter

    local, cuda = int(os.environ["LOCAL_RANK"]), torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo")
    device = "cuda" if cuda else "cpu"
    group = dist.new_group(list(range(dist.get_world_size())))
    rank, P, dtype = dist.get_rank(group), dist.get_world_size(group), DTYPES[dtype_name]
    is_image, cu, q, k, v, dout = _row(1024, 8192, 8, 64, dtype, device)
    plan = vlmcp.plan_cp(is_image, P, cu)
    shard = plan.for_rank(rank)
    work = vlmcp.attended_pairs(plan, "causal")
    share = max(work.total_pairs) / work.single_process_pairs
    local_x = [shard.shard(t).requires_grad_() for t in (q, k, v)]
    ldout = shard.shard(dout)
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    result = {"P": P, "dtype": dtype_name, "share": share}

    def fwd_bwd(fn, xs, d):
        with SavedTensorMeter() as meter:
            out = fn()
        (out * d).sum().backward()
        return meter.bytes

    def barrier():
        dist.barrier(group=group, **({"device_ids": [local]} if cuda else {}))

    def timed(fn, xs, d, together=True):
        fwd_bwd(fn, xs, d)
        times, saved = [], 0
        for _ in range(repeats):
            if together:  # every rank starts each repeat at once
                barrier()
            _sync()
            t0 = time.perf_counter()
            saved = fwd_bwd(fn, xs, d)
            _sync()
            times.append(time.perf_counter() - t0)
        return times, saved

    if rank == 0:  # the others wait idle at the barrier below
        single, saved1 = timed(lambda: varlen_attention(*whole, cu, is_image)[0], whole, dout,
                               together=False)
        result["single_ms"], result["single_saved"] = statistics.median(single) * 1e3, saved1
    barrier()
    for backend in ("ring", "ulysses"):
        times, saved = timed(lambda backend=backend: cp_attention(*local_x, shard, group, backend),
                             local_x, ldout)
        gathered = [None] * P
        dist.all_gather_object(gathered, (statistics.median(times) * 1e3, saved), group=group)
        result[backend] = gathered
    if rank == 0:
        with open(path, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


def bench_cp(repeats: int, timeout: int) -> tuple[bool, list[str]]:
    n = torch.cuda.device_count()
    if n < 2:
        return True, [f"CP over GPUs: skipped ({n} GPU; ring and Ulysses need two or more)"]
    lines, ok = [], True
    for dtype_name in ("bfloat16", "float32"):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "cp.json")
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
                   os.path.abspath(__file__), "--worker", out, "--repeats", str(repeats),
                   "--dtype", dtype_name]
            what = f"CP over {n} GPUs ({dtype_name})"
            try:
                proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                return False, lines + [f"{what}: no result within {timeout} s (a hang?)"]
            if proc.returncode != 0:
                tail = (proc.stdout + proc.stderr).splitlines()[-20:]
                return False, lines + [f"{what}: torchrun failed"] + ["  " + t for t in tail]
            with open(out) as f:
                lines += cp_report(json.load(f))
    return ok, lines


def cp_report(r: dict) -> list[str]:
    """Report lines of one :func:`bench_worker` result."""
    single = r["single_ms"]
    lines = [f"CP over {r['P']} GPUs, {r['dtype']}: single process {single:.1f} ms fwd+bwd, "
             f"busiest rank's pair share {r['share']:.3f}"]
    for backend in ("ring", "ulysses"):
        ms = [t for t, _ in r[backend]]
        saved = max(s for _, s in r[backend]) / max(r["single_saved"], 1)
        lines.append(f"  [{backend}] slowest rank {max(ms):.1f} ms = {max(ms) / single:.3f} x single; "
                     f"efficiency {single * r['share'] / max(ms):.2f}; saved for backward "
                     f"{saved:.3f} x single (largest rank)")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--skip-tests", action="store_true", help="only the benchmark")
    p.add_argument("--skip-bench", action="store_true", help="only the GPU tests")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement (median)")
    p.add_argument("--timeout", type=int, default=900, help="seconds for the tests, and for each torchrun")
    p.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    p.add_argument("--dtype", default="bfloat16", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        bench_worker(args.worker, args.repeats, args.dtype)
        return 0
    print("vlmcp GPU check", flush=True)
    if not torch.cuda.is_available():
        print(f"  no CUDA device (torch {torch.__version__}): nothing checked. Run it where "
              "torch.cuda.is_available() is True, with a CUDA build of torch.")
        return 2
    ok, report = True, [*environment()]
    for line in report:
        print("  " + line, flush=True)
    sections = []
    if not args.skip_tests:
        sections.append(lambda: run_tests(args.timeout))
    if not args.skip_bench:
        sections.append(lambda: (True, bench_single(args.repeats)))
        sections.append(lambda: bench_cp(args.repeats, args.timeout))
    for section in sections:
        t0 = time.perf_counter()
        try:
            good, lines = section()
        except Exception as err:  # a crash in a measurement is a finding, reported like the others
            good, lines = False, [f"crashed: {type(err).__name__}: {err}"]
        ok &= good
        lines[0] += f"  [{time.perf_counter() - t0:.0f} s]"
        for line in lines:
            print("  " + line, flush=True)
            report.append(line)
    print(f"verdict: {'the CUDA path works' if ok else 'FAILED (see above)'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
