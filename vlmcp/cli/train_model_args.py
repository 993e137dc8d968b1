"""The flags ``vlmcp train`` takes for a Hugging Face model directory (``--model DIR``): the model,
its data and the parallelism only a model directory has (:func:`add_model_arguments`)."""

from __future__ import annotations

import argparse

from vlmcp.cli.data_options import add_data_arguments
from vlmcp.cli.train_lora_args import add_lora_arguments
from vlmcp.cli.video import add_video_arguments

__all__ = ["add_model_arguments"]


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The model directory's flags, its LoRA flags and its video flags, each in a group of its own."""
    g = p.add_argument_group(
        "Hugging Face model (with --model)",
        "The shared flags above apply too. Checkpoints go to --checkpoint-dir (default OUT/checkpoints): "
        "every --checkpoint-every steps and at the end when either flag is given, and always when a SIGTERM "
        "stops the run. --image-strategy replicate|shard|auto is passed to vlmcp.hf.shard_inputs.")
    g.add_argument("--model", default=None, metavar="DIR",
                   help="a local HF VLM directory (any architecture with a vlmcp adapter: Qwen2/2.5/3-VL, "
                        "Qwen3.5, GLM-4.1V, LLaVA, LLaVA-NeXT/OneVision, InternVL, SmolVLM, Mistral3, "
                        "Gemma 3, Kimi-K2.5, LFM2-VL); none: the reference VLM")
    g.add_argument("--data", default=None, action="append", metavar="FILE.jsonl",
                   help="conversations: LLaMA-Factory/ms-swift messages+images+videos or LLaVA "
                        "conversations; repeat for several files, read in order")
    g.add_argument("--output-dir", default=None, metavar="OUT",
                   help="where the trained model and processor are saved (save_pretrained)")
    g.add_argument("--image-root", default=None, metavar="DIR",
                   help="relative image and video paths start here; none: the JSONL file's directory")
    g.add_argument("--strict", action="store_true",
                   help="stop before training on a conversation longer than --seq-len or an image or video "
                        "that cannot be read or decoded (every image and video is decoded up front), instead "
                        "of skipping it")
    g.add_argument("--fsdp", action="store_true",
                   help="FSDP2 over the DP x CP ranks (loss scaled by P), sharded checkpoints")
    g.add_argument("--activation-checkpointing", action="store_true",
                   help="recompute each decoder block in backward")
    g.add_argument("--offload-activations", action="store_true",
                   help="keep the tensors saved for backward (with --activation-checkpointing: the blocks' "
                        "inputs) in pinned CPU memory until backward; exact")
    g.add_argument("--loss", choices=("chunked", "full"), default="chunked",
                   help="chunked (default): the LM head and the cross-entropy --loss-chunk-size target "
                        "tokens at a time, never the tokens x vocab logits; full: the model's logits "
                        "(for comparison)")
    g.add_argument("--loss-chunk-size", type=int, default=4096, metavar="N",
                   help="target tokens per chunk of logits of --loss chunked (default 4096)")
    add_data_arguments(g)
    add_lora_arguments(p)
    add_video_arguments(p.add_argument_group(
        "videos (with --model)", "How a video becomes frames, as the model's own processor samples them "
        "(qwen-vl-utils for Qwen2-VL and Qwen2.5-VL; the video processor for Qwen3-VL, Qwen3.5 and GLM-4.1V; "
        "a fixed count for LLaVA-OneVision): frames at --video-fps within the frame bounds, each resized to "
        "a multiple of F = patch_size*merge_size pixels per side within the pixel bounds."))
