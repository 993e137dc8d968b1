"""The data flags of ``vlmcp train --model``: LLaMA-Factory datasets, image pixel bounds, truncation.

``--dataset NAME[,NAME] --dataset-dir DIR`` reads LLaMA-Factory's ``dataset_info.json``
(:mod:`vlmcp.data.hf.dataset_info`), ``--eval-dataset`` its held-out datasets;
``--image-max-pixels`` / ``--image-min-pixels`` bound every image as LLaMA-Factory does, before
the processor, in planning and in training alike (:mod:`vlmcp.data.hf.image_bounds`);
``--truncate`` cuts a conversation longer than ``--seq-len`` instead of skipping it, never
inside an image or video; ``--max-samples N`` reads the first N lines of each file or dataset.
"""

from __future__ import annotations

__all__ = ["DATA_FLAGS", "add_data_arguments"]

DATA_FLAGS = ("dataset", "dataset_dir", "eval_dataset", "image_max_pixels", "image_min_pixels", "truncate",
              "max_samples")
"""The dests these flags set (all need ``--model``)."""


def add_data_arguments(group) -> None:
    """Add the flags to ``group`` (a parser or an argument group)."""
    group.add_argument("--dataset", default=None, metavar="NAME[,NAME]",
                       help="datasets named in --dataset-dir/dataset_info.json (LLaMA-Factory's; file_name, "
                            "formatting sharegpt|alpaca, columns, tags), read after any --data files")
    group.add_argument("--dataset-dir", default=None, metavar="DIR",
                       help="the directory of dataset_info.json, where relative image paths start; none: "
                            "./data, as in LLaMA-Factory")
    group.add_argument("--eval-dataset", default=None, metavar="NAME[,NAME]",
                       help="held-out datasets named in dataset_info.json, evaluated with any --eval-data "
                            "files")
    group.add_argument("--image-max-pixels", type=int, default=None, metavar="PX",
                       help="scale every image down (aspect kept) to at most PX pixels before the processor, "
                            "as LLaMA-Factory's image_max_pixels; none: no bound")
    group.add_argument("--image-min-pixels", type=int, default=None, metavar="PX",
                       help="scale every image up to at least PX pixels before the processor; none: no bound")
    group.add_argument("--truncate", action="store_true",
                       help="cut a conversation longer than --seq-len at --seq-len (before an image or video "
                            "that would be cut) instead of skipping it")
    group.add_argument("--max-samples", type=int, default=None, metavar="N",
                       help="read only the first N lines of each --data file and --dataset; none: all")
