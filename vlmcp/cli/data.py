"""``vlmcp data``: datasets as files ``vlmcp train --data`` reads, and what a line trains.

``vlmcp data shapes --out DIR --samples N [--videos V]`` exports the built-in
shapes-and-captions data as ``DIR/train.jsonl`` (LLaMA-Factory / ms-swift ``messages`` +
``images``) and ``DIR/images/*.png``, then V videos of moving shapes captioned with their
motion ("a red square moves left") in ``DIR/videos/*.mp4`` (``--video-frames`` and
``--video-size`` make them long: ``--video-frames 2400`` is ten minutes at 4 fps).

``vlmcp data show --model DIR --data FILE [--line N] [--json]`` prints one conversation
as the model's chat template renders it, with the tokens that carry loss between ``[[``
and ``]]``, each image as ``<image>``, each video as ``<video>``, and the token, image and
video counts. ``--json`` prints ``{"text", "trained", "tokens", "images", "videos"}``: the
text with one ``<image>`` per image and one ``<video>`` per video, the trained runs
decoded one by one. Only image and video headers are read; videos are sampled by the
``--video-*`` flags, as ``vlmcp train`` samples them.
"""

from __future__ import annotations

import argparse
import json
import os

from vlmcp.cli import command_help
from vlmcp.cli.paths import check_writable_dir
from vlmcp.cli.video import add_video_arguments, video_sampling


def add_parser(sub) -> None:
    p = sub.add_parser("data", help=command_help("data"),
                       description=__doc__)
    kinds = p.add_subparsers(dest="dataset", required=True, metavar="ACTION")
    shapes = kinds.add_parser("shapes", help="the built-in shapes-and-captions data",
                              formatter_class=p.formatter_class)
    shapes.add_argument("--out", required=True, metavar="DIR",
                        help="writes DIR/train.jsonl, DIR/images/ and (with --videos) DIR/videos/")
    shapes.add_argument("--samples", type=int, default=1000, help="image and text conversations to write")
    shapes.add_argument("--videos", type=int, default=0, metavar="N",
                        help="then N conversations about a video of moving shapes (MP4 at 4 fps, "
                             "--video-frames frames of --video-size pixels a side; needs PyAV)")
    shapes.add_argument("--video-frames", type=int, default=8, metavar="N",
                        help="frames of each video (at 4 fps: 240 are a minute; long videos for CP)")
    shapes.add_argument("--video-size", type=int, default=64, metavar="PX",
                        help="side of each video's frames in pixels (even)")
    shapes.add_argument("--seed", type=int, default=0, help="dataset seed")
    show = kinds.add_parser(
        "show", help="one conversation as the model sees it, trained tokens marked",
        formatter_class=p.formatter_class,
        description="Print one conversation as the model's chat template renders it. Markers: the tokens "
                    "between [[ and ]] carry loss; <image> is one image and <video> one video (however many "
                    "tokens it takes). The first line gives file:line and the token, trained-token, image "
                    "and video counts. Only image and video headers are read (no pixel is decoded).")
    show.add_argument("--model", required=True, metavar="DIR", help="a local HF VLM directory")
    show.add_argument("--data", required=True, action="append", metavar="FILE",
                      help="conversations file; repeat for several, read in order as vlmcp train does")
    show.add_argument("--line", type=int, default=None, metavar="N",
                      help="the conversation on line N (in a .json list, the N-th object) of the first file "
                           "that has one; default the first conversation")
    show.add_argument("--image-root", default=None, metavar="DIR",
                      help="relative image and video paths start here; none: each data file's directory")
    show.add_argument("--json", action="store_true",
                      help='print {"text", "trained", "tokens", "images", "videos"} as one JSON object')
    add_video_arguments(show.add_argument_group("videos", "How a video becomes frames (as vlmcp train)."))


def _show(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vlmcp.data.hf.processor import load_processor
    from vlmcp.data.hf.reader import read_conversations
    from vlmcp.data.hf.show import select_line, view_conversation

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory: nothing to download
    if not (Path(args.model) / "config.json").is_file():
        raise ValueError(f"--model {args.model}: not a model directory (no config.json)")
    processor = load_processor(args.model)
    conv = select_line(read_conversations(args.data, args.image_root), args.line, args.data)
    view = view_conversation(processor, conv, video_sampling(args))
    print(json.dumps(view.to_json(), ensure_ascii=False) if args.json else view.plain())
    return 0


def run(args: argparse.Namespace) -> int:
    if args.dataset == "show":
        return _show(args)
    from vlmcp.data.hf.export import export_shapes

    if args.videos < 0:
        raise ValueError(f"--videos must be an integer >= 0, got {args.videos}")
    if args.samples < (0 if args.videos else 1):
        raise ValueError(f"--samples must be an integer >= 1 (>= 0 with --videos), got {args.samples}")
    check_writable_dir("--out", args.out)

    path = export_shapes(args.out, args.samples, seed=args.seed, videos=args.videos,
                         video_frames=args.video_frames, video_size=args.video_size)
    videos = f" (the last {args.videos} about videos)" if args.videos else ""
    print(f"vlmcp data shapes: wrote {args.samples + args.videos} conversations{videos} to {path}")
    return 0
