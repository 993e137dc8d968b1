"""A Hugging Face model directory's side of ``vlmcp train --model`` before its ranks run (on the launcher).

Before any rank starts, the launching process checks the model directory (an adapter for its
architecture, its vision modes, Ulysses heads: :mod:`.model_check`), loads the processor, reads
and checks every line of the data, measures every conversation and plans the packed rows; all
ranks then share that plan (the :class:`~vlmcp.train.specs.hf.spec.HFSpec` carries it). Under
torchrun each rank makes the same checks and the same plan itself.

Bad samples never stop a long run silently, nor train wrongly: a conversation longer than
``--seq-len``, or with an image or video whose header cannot be read, is skipped at planning;
one whose image or video fails to decode during training is skipped then, on every rank of its
CP group. Each is named (``file:line`` and the file) and counted in the opening plan line and
the final summary (:mod:`.report`). ``--strict`` turns all of them into one-line errors before
any rank starts (it decodes every image and video up front).

Every function that prints takes ``say``, the command line's print-once-per-run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from vlmcp.train.specs.hf.config import LORA_LR, HFTrainConfig
from vlmcp.train.specs.hf.model_check import check_model_dir
from vlmcp.train.specs.hf.report import has_videos, print_summary, skips_line
from vlmcp.train.specs.hf.spec import HFSpec

__all__ = ["CONFIG", "announce", "config_values", "finished", "outputs", "plan_data", "plan_eval",
           "preload_model_code", "prepare", "record_dir", "report"]

CONFIG = HFTrainConfig

def _quiet(line: str, file=None) -> None:
    pass


def config_values(values: dict) -> dict:
    """The config's fields from the flags given (``values``, by field): a model directory, its data and
    an output directory go together; ``--lr`` defaults to :data:`LORA_LR` with ``--lora``."""
    if values.get("model") is None or not (values.get("data") or values.get("dataset")) or \
            values.get("output_dir") is None:
        raise ValueError("--model, --data (or --dataset) and --output-dir go together (a model directory, "
                         "its training data and where the trained model goes)")
    values = {"data": (), **values}  # --dataset alone
    if "lr" not in values and values.get("lora"):
        values["lr"] = LORA_LR
    return values


def check_output_outside_model(output_dir, model) -> None:
    """``--output-dir`` that is, or lies inside, ``--model`` would overwrite the model it starts from."""
    out, src = Path(os.path.realpath(output_dir)), Path(os.path.realpath(model))
    if out == src or src in out.parents:
        where = "is" if out == src else "lies inside"
        raise ValueError(f"--output-dir {output_dir} {where} --model {model}: "
                         "the trained model would overwrite (or mix with) the model it starts from; choose "
                         "another directory")


def outputs(cfg: HFTrainConfig) -> list[tuple[str, Path]]:
    """The directories the run writes besides its checkpoints and metrics, each with the flag that names it
    (checked writable before any rank starts); an ``--output-dir`` in ``--model`` and a missing
    TensorBoard are refused here."""
    if not (Path(cfg.model) / "config.json").is_file():
        raise ValueError(f"--model {cfg.model}: not a model directory (no config.json)")
    check_output_outside_model(cfg.output_dir, cfg.model)
    places = [("--output-dir", Path(cfg.output_dir))]
    if cfg.tensorboard_dir is not None:
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            raise ValueError("--report-to tensorboard needs the tensorboard package: pip install "
                             "'vlmcp[tensorboard]'")
        places.append(("--report-to tensorboard's directory", cfg.tensorboard_dir))
    return places


def plan_data(cfg: HFTrainConfig, say=_quiet):
    """Load the processor, read and check the data, plan the rows (errors name the line)."""
    return _plan(cfg, say)[1]


def _plan(cfg: HFTrainConfig, say):
    """``(processor, index)``; with ``--strict`` every image is decoded too."""
    check_model_dir(cfg.model, cp=cfg.cp, attention=cfg.attention, vision_mode=cfg.vision_mode)
    from vlmcp.data.hf.dataset_info import resolve_datasets
    from vlmcp.data.hf.image_bounds import ImageBounds
    from vlmcp.data.hf.processor import load_processor
    from vlmcp.data.hf.reader import read_conversations
    from vlmcp.data.hf.rows import build_index

    processor = load_processor(cfg.model)
    sources = [*cfg.data, *resolve_datasets(cfg.dataset or (), cfg.dataset_dir)]
    data = read_conversations(sources, cfg.image_root, max_samples=cfg.max_samples)
    source = " ".join(([f"--data {', '.join(cfg.data)}"] if cfg.data else [])
                      + ([f"--dataset {cfg.dataset}"] if cfg.dataset else []))
    bounds = ImageBounds(min_pixels=cfg.image_min_pixels, max_pixels=cfg.image_max_pixels)
    index = build_index(processor, data, cfg.seq_len, strict=cfg.strict, source=source, video=cfg.video,
                        images=bounds, truncate=cfg.truncate)
    if cfg.strict:
        _decode_every_image(processor, index, say)
    return processor, index


def plan_eval(cfg: HFTrainConfig, processor):
    """The planned ``--eval-data`` and ``--eval-dataset`` (None without them); read and checked like
    ``--data``, with the same image bounds, truncation and ``--max-samples``."""
    if not cfg.eval_data and not cfg.eval_dataset:
        return None
    from vlmcp.data.hf.dataset_info import resolve_datasets
    from vlmcp.data.hf.image_bounds import ImageBounds
    from vlmcp.data.hf.reader import read_conversations
    from vlmcp.data.hf.rows import build_index

    sources = [*cfg.eval_data, *resolve_datasets(cfg.eval_dataset or (), cfg.dataset_dir)]
    data = read_conversations(sources, cfg.image_root, max_samples=cfg.max_samples)
    bounds = ImageBounds(min_pixels=cfg.image_min_pixels, max_pixels=cfg.image_max_pixels)
    source = " ".join(([f"--eval-data {', '.join(cfg.eval_data)}"] if cfg.eval_data else [])
                      + ([f"--eval-dataset {cfg.eval_dataset}"] if cfg.eval_dataset else []))
    return build_index(processor, data, cfg.seq_len, strict=cfg.strict, source=source, video=cfg.video,
                       images=bounds, truncate=cfg.truncate)


def _decode_every_image(processor, index, say) -> None:
    """``--strict``: decode every image and video now, with a progress line; the first failure
    is the error."""
    from vlmcp.data.hf.encode import MediaError, check_pixels

    total = sum(len(c.images) + len(c.videos) for c in index.conversations)
    if not total:
        return
    one = "image and video" if has_videos(index) else "image"
    what = "images and videos" if has_videos(index) else "images"
    tty = os.environ.get("RANK", "0") == "0" and sys.stdout.isatty()
    say(f"vlmcp train: --strict: decoding {total} {what} before training")
    done = 0
    for conv in index.conversations:
        try:
            check_pixels(conv, processor, index.video)
        except MediaError as err:
            if tty:
                print(flush=True)
            raise ValueError(f"{err} (--strict decodes every {one} before training)") from None
        done += len(conv.images) + len(conv.videos)
        if tty:
            print(f"\rvlmcp train: --strict: {done}/{total} {what} decoded", end="", flush=True)
    if tty:
        print(flush=True)
    say(f"vlmcp train: --strict: all {total} {what} decode")


def prepare(cfg: HFTrainConfig, say) -> HFSpec:
    """Check the model directory, plan the data and the held-out data; the spec the ranks run (its
    ``steps`` resolved from ``--epochs``)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory: nothing to download
    processor, index = _plan(cfg, say)
    cfg = cfg.with_steps(len(index.rows))  # --epochs: the steps of that many passes over the rows
    from vlmcp.train.specs.hf.finetune import check_model

    check_model(cfg)  # --freeze, --lora on the architecture (meta device)
    eval_index = plan_eval(cfg, processor)
    if cfg.strict and eval_index is not None:
        _decode_every_image(processor, eval_index, say)
    spec = HFSpec(cfg, index, eval_index)
    spec.processor = processor  # for the first view; every rank loads its own (not sent to them)
    return spec


def finished(cfg: HFTrainConfig) -> bool:
    """Whether the final model of ``--steps`` is saved whole (a save that died part way is not)."""
    from vlmcp.train.specs.hf.final_model import final_model_complete

    return final_model_complete(cfg.output_dir, cfg.steps)


def record_dir(cfg: HFTrainConfig) -> Path:
    """Where the resolved configuration of the run is written (``vlmcp_config.yaml``)."""
    return Path(cfg.output_dir)


def announce(spec: HFSpec, say, spawning: bool) -> None:
    """The plan lines, the unreadable media, the first conversation as the model sees it; when the ranks
    are spawned here, the spawning line (and the model's code preloaded in the fork server)."""
    cfg, index, eval_index = spec.cfg, spec.index, spec.eval_index
    fill = index.tokens / (len(index.rows) * cfg.seq_len)
    say(f"vlmcp train: {cfg.model} on {len(index.conversations)} conversations in {len(index.rows)} rows "
        f"of {cfg.seq_len} tokens ({fill:.0%} filled); {skips_line(cfg, index)}")
    say(f"vlmcp train: {cfg.steps} steps of {cfg.rows_per_step} rows (--dp {cfg.dp} x --grad-accum "
        f"{cfg.grad_accum}), {cfg.steps * cfg.rows_per_step / len(index.rows):.3g} epochs; lr {cfg.lr:g}, "
        f"{cfg.lr_scheduler} after {cfg.warmup} warm-up steps, weight decay {cfg.weight_decay:g}, "
        f"max grad norm {cfg.max_grad_norm:g}"
        + (f"; eval on {len(eval_index.rows)} rows of --eval-data "
           f"{'every ' + str(cfg.eval_every) + ' steps and ' if cfg.eval_every else ''}at the end"
           if eval_index is not None else ""))
    for skip in index.unreadable[:5]:
        say(f"vlmcp train: warning: {skip.where}: {skip.reason}; skipped")
    if len(index.unreadable) > 5:
        say(f"vlmcp train: warning: ... and {len(index.unreadable) - 5} more conversations with an "
            f"unreadable {'image or video' if has_videos(index) else 'image'}")
    say(_first_view(cfg, spec.processor, index))
    if spawning:
        say(f"vlmcp train: spawning {cfg.world_size} gloo ranks (cp={cfg.cp}, dp={cfg.dp}"
            f"{', fsdp' if cfg.fsdp else ''}), {cfg.steps} steps")
        preload_model_code(cfg.model)


def _first_view(cfg: HFTrainConfig, processor, index) -> str:
    """What the run's first conversation trains (``vlmcp data show``'s view, one screen at most)."""
    from vlmcp.data.hf.rows import row_at
    from vlmcp.data.hf.show import view_conversation

    i = index.rows[row_at(index, cfg.seed, 0)][0]
    conv = index.conversations[i]
    more = f"; vlmcp data show --model {cfg.model} --data {conv.source} --line {conv.line} prints it all"
    view = view_conversation(processor, conv, index.video, index.images).plain(max_lines=30, max_chars=2400,
                                                                              more=more)
    cut = index.cuts[i] if index.cuts else None
    cut = f"\n(--truncate trains its first {cut.tokens} tokens)" if cut else ""
    return f"vlmcp train: the first conversation as the model sees it ([[...]] carries loss):\n{view}{cut}"


def preload_model_code(model_dir: str) -> None:
    """Import transformers and the model's code in the fork server, once, not in every rank.

    ``vlmcp.launch`` starts ranks from a fork server (forkserver context, the same object
    for every caller); modules it imported before forking cost a rank nothing.
    """
    import json
    import multiprocessing

    model_type = json.loads((Path(model_dir) / "config.json").read_text()).get("model_type", "")
    modules = ["torch", "torch.distributed", "vlmcp", "vlmcp.hf", "transformers",
               "transformers.models.auto.modeling_auto"]
    if model_type.isidentifier():
        modules.append(f"transformers.models.{model_type}.modeling_{model_type}")
    multiprocessing.get_context("forkserver").set_forkserver_preload(modules)


def report(spec: HFSpec, summary: dict) -> int:
    """Print the run's summary (rank 0, after the run); returns the exit code."""
    return print_summary(spec.cfg, spec.index, summary)
