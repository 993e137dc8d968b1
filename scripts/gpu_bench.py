"""The GPU figures in one table (``make gpu-bench``, at most about 8 minutes on one GPU).

1. Kernel parity: each CUDA kernel vlmcp can pick (flash-attn varlen, SDPA; fla's gated delta
   rule where flash-linear-attention is installed) against vlmcp's CPU path on the same inputs
   (the CPU flash kernel, the torch delta-rule kernel, in float64): the largest relative error
   of the outputs, the log-sum-exp and every input gradient, in bfloat16 and float32, on a packed
   row with an image (bidirectional within it) and a text-only sample.
2. A whole Hugging Face step on one GPU (P=1): a random model of Qwen2.5-VL-3B's shapes (LLM
   2048 x 36 layers, 16 heads over 2 K/V heads, SwiGLU 11008, vocabulary 151,936; ViT 1280 x 32
   blocks), bfloat16, every decoder layer and ViT block checkpointed, the chunked loss
   (:func:`vlmcp.hf.causal_lm_loss`), AdamW; one image of 1,024 LLM tokens and text up to
   8k / 32k / 64k tokens. Per length: seconds per step (median of ``--repeats`` after one
   untimed step), tokens/s, and MFU = model FLOPs per step / time / the GPU's dense bf16 peak
   (model FLOPs: 6 x the LLM's non-embedding parameters x tokens + 6 x layers x hidden x
   (causal) attended pairs x 2, the ViT's likewise over its patches, the head 6 x hidden x
   vocab x tokens; checkpointing's recomputation not counted, as MFU is defined; the ViT's
   attention counted as full, an upper bound: most of its blocks attend within windows).
3. Memory: ``torch.cuda.max_memory_allocated()`` of that step against ``vlmcp plan --model``'s
   prediction (:func:`vlmcp.estimate.estimate_memory`) for the same run.

Without CUDA it says so and exits 2; ``--tiny`` runs the same code on the CPU with a tiny model and
short rows (what the CPU test suite does to keep this script working: tests/test_gpu_bench.py).
``--json FILE`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# dense bf16 tensor-core peaks (FLOP/s), by the device name's family
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "H800": 989e12, "A100": 312e12, "A800": 312e12, "L40S": 362e12,
             "B200": 2250e12, "GB200": 2500e12}

QWEN25_VL_3B = {
    "text": dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                 intermediate_size=11008, vocab_size=151936, max_position_embeddings=131072,
                 rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]}, tie_word_embeddings=True),
    "vision": dict(hidden_size=1280, depth=32, num_heads=16, intermediate_size=3420, out_hidden_size=2048,
                   patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                   fullatt_block_indexes=[7, 15, 23, 31]),
}
TINY = {
    "text": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=512, max_position_embeddings=4096, bos_token_id=0,
                 eos_token_id=1,
                 rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, tie_word_embeddings=True),
    "vision": dict(hidden_size=32, depth=2, num_heads=2, intermediate_size=64, out_hidden_size=64,
                   patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                   fullatt_block_indexes=[1]),
}


def peak_flops(device: torch.device) -> float | None:
    """The device's dense bf16 peak, or None where its name is not in :data:`PEAK_BF16`."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in sorted(PEAK_BF16.items(), key=lambda kv: -len(kv[0])) if k in name), None)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _parity_row(check: str, dtype: torch.dtype, errs: dict) -> dict:
    return {"check": check, "dtype": str(dtype).split(".")[1],
            "result": ", ".join(f"{k} {v:.1e}" for k, v in errs.items()), "worst": max(errs.values())}


# --- 1. kernel parity --------------------------------------------------------------------------

def _attention_row(dtype, device, heads=8, kv_heads=2, dim=64, seed=0):
    """A packed row: a prompt, a 256-token image (bidirectional), an answer; then a text-only sample."""
    lens = [32, 256, 224, 512]
    is_image = torch.zeros(sum(lens), dtype=torch.bool)
    is_image[32:288] = True
    cu = torch.tensor([0, 512, 1024], dtype=torch.int32)
    g = torch.Generator().manual_seed(seed)
    L = is_image.numel()
    q = torch.randn(L, heads, dim, generator=g, dtype=torch.float64)
    k, v = (torch.randn(L, kv_heads, dim, generator=g, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(L, heads, dim, generator=g, dtype=torch.float64)
    return is_image, cu, [t.to(device, dtype) for t in (q, k, v)], dout.to(device, dtype)


def _attention(x, dout, cu, is_image, kernel):
    from vlmcp.attention import varlen_attention

    x = [t.detach().clone().requires_grad_() for t in x]
    out, lse = varlen_attention(*x, cu, is_image, image_attention="bidirectional", kernel=kernel)
    (out * dout).sum().backward()
    grads = {f"d{n}": t.grad for n, t in zip("qkv", x, strict=True)}
    return {"out": out.detach(), "lse": lse.detach(), **grads}


def attention_parity(device: torch.device) -> list[dict]:
    """Each CUDA attention kernel against the CPU flash kernel in float64 on the same inputs."""
    from vlmcp.attention.kernels import FlashAttnKernel

    rows = []
    is_image, cu, x64, dout64 = _attention_row(torch.float64, "cpu")
    reference = _attention(x64, dout64, cu, is_image, "flash_cpu")
    candidates = ("sdpa", "flash_attn") if device.type == "cuda" else ("math",)  # --tiny: the CPU's other
    for name in candidates:
        if name == "flash_attn" and not FlashAttnKernel.available():
            rows.append({"check": f"attention {name}", "dtype": "-",
                         "result": "skipped: flash-attn not installed"})
            continue
        for dtype in (torch.bfloat16, torch.float32):
            try:
                x = [t.to(device, dtype) for t in x64]
                got = _attention(x, dout64.to(device, dtype), cu, is_image, name)
            except (RuntimeError, NotImplementedError, ValueError) as err:  # e.g. flash-attn has no float32
                rows.append({"check": f"attention {name}", "dtype": str(dtype).split(".")[1],
                             "result": f"refused: {str(err).splitlines()[0][:80]}"})
                continue
            errs = {key: _rel(got[key], reference[key]) for key in reference}
            rows.append(_parity_row(f"attention {name}", dtype, errs))
    return rows


def delta_rule_parity(device: torch.device) -> list[dict]:
    """fla's chunked gated delta rule against vlmcp's torch kernel in float64 (two segments)."""
    from vlmcp.mixers.delta_rule import _fla_kernel, chunk_gated_delta_rule

    if device.type != "cuda" or _fla_kernel() is None:
        why = "no CUDA" if device.type != "cuda" else "flash-linear-attention not installed"
        return [{"check": "gated delta rule fla", "dtype": "-", "result": f"skipped: {why}"}]
    g = torch.Generator().manual_seed(0)
    T, Hk, Hv, K, V = 384, 2, 4, 64, 64
    base = [torch.randn(T, Hk, K, generator=g, dtype=torch.float64), torch.randn(T, Hk, K, generator=g,
            dtype=torch.float64), torch.randn(T, Hv, V, generator=g, dtype=torch.float64),
            torch.nn.functional.logsigmoid(torch.randn(T, Hv, generator=g, dtype=torch.float64) + 2),
            torch.sigmoid(torch.randn(T, Hv, generator=g, dtype=torch.float64))]
    cu = torch.tensor([0, 130, T])

    def run(dtype, dev, kernel):
        x = [t.to(dev, dtype).requires_grad_() for t in base]
        out, _ = chunk_gated_delta_rule(*x, cu, use_qk_l2norm=True, kernel=kernel)
        out.float().sum().backward()
        grads = {f"d{n}": t.grad for n, t in zip(("q", "k", "v", "g", "beta"), x, strict=True)}
        return {"out": out.detach(), **grads}

    reference = run(torch.float64, "cpu", "torch")
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        got = run(dtype, device, "fla")
        errs = {key: _rel(got[key], reference[key]) for key in reference}
        rows.append(_parity_row("gated delta rule fla", dtype, errs))
    return rows


# --- 2. and 3. a whole HF step -----------------------------------------------------------------

def build_model(shapes: dict, device: torch.device):
    """A random Qwen2.5-VL of ``shapes`` in bfloat16 on ``device`` (built there: no host copy)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(text_config=shapes["text"], vision_config=shapes["vision"],
                              image_token_id=151655 if shapes is QWEN25_VL_3B else 500,
                              video_token_id=151656 if shapes is QWEN25_VL_3B else 501,
                              vision_start_token_id=151652 if shapes is QWEN25_VL_3B else 502)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2_5_VLForConditionalGeneration(config).to(torch.bfloat16)
    return model, config


def make_row(config, tokens: int, image_side: int, device: torch.device) -> tuple[dict, torch.Tensor]:
    """One row: a 16-token prompt, one ``image_side x image_side``-patch image, text up to ``tokens``."""
    vc = config.vision_config
    merge = vc.spatial_merge_size
    image_tokens = image_side * image_side // merge ** 2
    text = tokens - image_tokens
    g = torch.Generator().manual_seed(tokens)
    specials = min(config.image_token_id, config.video_token_id, config.vision_start_token_id)
    ids = torch.randint(0, min(specials, 100_000), (tokens,), generator=g)  # no stray image token
    ids[16:16 + image_tokens] = config.image_token_id
    ids[15] = config.vision_start_token_id
    patch = 3 * vc.temporal_patch_size * vc.patch_size ** 2
    inputs = {"input_ids": ids[None].to(device),
              "attention_mask": torch.ones(1, tokens, dtype=torch.long, device=device),
              "pixel_values": torch.randn(image_side ** 2, patch, generator=g).to(device, torch.bfloat16),
              "image_grid_thw": torch.tensor([[1, image_side, image_side]], device=device)}
    labels = ids.clone()
    labels[:16 + image_tokens] = -100
    assert text > 16, f"{tokens} tokens cannot hold the image's {image_tokens}"
    return inputs, labels[None].to(device)


def model_flops(config, tokens: int, image_side: int) -> float:
    """Model FLOPs of one training step (forward + backward, no recomputation): see the module doc."""
    t, v = config.text_config, config.vision_config
    head_dim = t.hidden_size // t.num_attention_heads
    layer = (t.hidden_size * (t.num_attention_heads + 2 * t.num_key_value_heads) * head_dim
             + t.hidden_size * t.hidden_size + 3 * t.hidden_size * t.intermediate_size)
    dense = 6 * layer * t.num_hidden_layers * tokens
    attention = 6 * 2 * t.num_hidden_layers * t.hidden_size * tokens * (tokens + 1) / 2
    head = 6 * t.hidden_size * t.vocab_size * tokens
    patches = image_side * image_side
    vit_layer = 4 * v.hidden_size ** 2 + 3 * v.hidden_size * v.intermediate_size
    vit = 6 * vit_layer * v.depth * patches + 6 * 2 * v.depth * v.hidden_size * patches * patches
    return float(dense + attention + head + vit)


def predicted_peak(config, tokens: int, image_side: int) -> float | None:
    """``vlmcp plan --model``'s predicted peak bytes for the step (None where it refuses)."""
    from vlmcp.estimate import EstimateSetup, estimate_memory

    setup = EstimateSetup(seq_len=tokens, visual_tokens=image_side * image_side // 4, images=1,
                          activation_checkpointing=True, dtype="bfloat16")
    try:
        return float(estimate_memory(config, setup).peak)
    except NotImplementedError:
        return None


def hf_step(model, inputs, labels, optimizer) -> None:
    import vlmcp.hf

    optimizer.zero_grad(set_to_none=True)
    batch = vlmcp.hf.shard_inputs(model, inputs, None, labels=labels)
    vlmcp.hf.causal_lm_loss(model, batch, None).loss.backward()
    vlmcp.reduce_gradients(model, None)
    optimizer.step()


def step_table(device: torch.device, lengths: list[int], repeats: int, shapes: dict, image_side: int,
               deadline: float) -> list[dict]:
    import vlmcp.hf

    model, config = build_model(shapes, device)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    vlmcp.hf.parallelize(model, None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    peak = peak_flops(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    for tokens in lengths:
        if time.monotonic() > deadline:
            rows.append({"tokens": tokens, "result": "skipped: the time budget is spent"})
            continue
        inputs, labels = make_row(config, tokens, image_side, device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        try:
            hf_step(model, inputs, labels, optimizer)  # untimed: allocator warm-up, AdamW's states
            times = []
            for _ in range(repeats):
                sync()
                t0 = time.perf_counter()
                hf_step(model, inputs, labels, optimizer)
                sync()
                times.append(time.perf_counter() - t0)
        except torch.OutOfMemoryError:
            rows.append({"tokens": tokens, "result": "out of memory"})
            continue
        seconds = statistics.median(times)
        flops = model_flops(config, tokens, image_side)
        row = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
               "tflops": flops / seconds / 1e12, "mfu": flops / seconds / peak if peak else None,
               "peak_bytes": float(torch.cuda.max_memory_allocated(device)) if device.type == "cuda"
               else None,
               "predicted_bytes": predicted_peak(config, tokens, image_side)}
        rows.append(row)
        print(_step_line(row), flush=True)
    return rows


def _gib(x) -> str:
    return "-" if x is None else f"{x / 2 ** 30:.1f} GiB"


def _step_line(row: dict) -> str:
    if "result" in row:
        return f"  {row['tokens']:>6,} tokens: {row['result']}"
    mfu = "-" if row["mfu"] is None else f"{row['mfu']:.1%}"
    ratio = (f" (measured / predicted {row['peak_bytes'] / row['predicted_bytes']:.2f})"
             if row["peak_bytes"] and row["predicted_bytes"] else "")
    return (f"  {row['tokens']:>6,} tokens: {row['seconds']:.2f} s/step, "
            f"{row['tokens_per_s']:,.0f} tokens/s, "
            f"{row['tflops']:.0f} TFLOP/s, MFU {mfu}; max_memory_allocated {_gib(row['peak_bytes'])}, "
            f"vlmcp plan {_gib(row['predicted_bytes'])}{ratio}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768, 65536], help="row tokens")
    parser.add_argument("--repeats", type=int, default=2, help="timed steps per length (after one untimed)")
    parser.add_argument("--image-side", type=int, default=64, help="the image's patches per side (64: 1,024 "
                        "LLM tokens)")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds after which lengths are skipped")
    parser.add_argument("--tiny", action="store_true", help="a tiny model on the CPU (checks this script)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.budget
    if args.tiny:
        device, shapes = torch.device("cpu"), TINY
        lengths = [n for n in args.lengths if n <= 4096] or [256, 512]
        image_side = 8
    elif not torch.cuda.is_available():
        print("make gpu-bench: no CUDA device here; nothing measured (--tiny runs the script on the CPU)",
              file=sys.stderr)
        return 2
    else:
        device, shapes = torch.device("cuda"), QWEN25_VL_3B
        lengths, image_side = args.lengths, args.image_side
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (--tiny)"
    print(f"vlmcp gpu-bench on {name}, torch {torch.__version__}", flush=True)
    print("1. kernel parity against the CPU path in float64 (relative error: out, lse, input gradients)")
    parity = attention_parity(device) + delta_rule_parity(device)
    for row in parity:
        print(f"  {row['check']:<22} {row['dtype']:<9} {row['result']}", flush=True)
    print(f"2./3. a whole HF step at P=1: {'Qwen2.5-VL-3B shapes' if shapes is QWEN25_VL_3B else 'tiny'}, "
          f"bfloat16, checkpointed, chunked loss, AdamW; one image of {image_side ** 2 // 4:,} tokens")
    steps = step_table(device, lengths, args.repeats, shapes, image_side, deadline)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "parity": parity, "steps": steps}, f, indent=1, default=str)
    ok = all("seconds" in r and math.isfinite(r["seconds"]) for r in steps)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
