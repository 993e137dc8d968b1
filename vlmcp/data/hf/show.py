"""What one conversation trains, as the model will see it: ``vlmcp data show``.

``vlmcp train --model`` prints the same view of its first conversation when it starts.
The view is the chat template's text with two kinds of marker:

=================  ===========================================================
``[[`` ... ``]]``  the tokens inside carry loss (maximal runs of them)
``<image>``        one image, wherever the template puts it (its tokens, however many)
``<video>``        one video, likewise
=================  ===========================================================

(text that itself contains ``[[``, ``]]``, ``<image>`` or ``<video>`` is printed as it is;
the ``--json`` form keeps the trained runs apart). Counts come from the image and video
headers, as planning does (:func:`vlmcp.data.hf.encode.plan_expansion`): no pixel is decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vlmcp.data.hf.encode import plan_expansion, video_plans
from vlmcp.data.hf.schema import (
    IMAGE_PLACEHOLDER,
    VIDEO_PLACEHOLDER,
    Conversation,
    ConversationSet,
    line_name,
)
from vlmcp.data.hf.video import VideoSampling, video_rules

__all__ = ["ConversationView", "select_line", "view_conversation"]

OPEN, CLOSE = "[[", "]]"
"""Where trained tokens start and end in the plain view."""


@dataclass(frozen=True)
class ConversationView:
    """One conversation as the model sees it.

    Attributes:
        where: ``file:line``.
        text: the rendered text, each image's (video's) placeholder token written ``<image>``
            (``<video>``).
        marked: ``text`` with each trained run between ``[[`` and ``]]``.
        trained: the decoded maximal runs of tokens that carry loss, in order.
        tokens: tokens after the images are expanded.
        trained_tokens: tokens that carry loss.
        images: images; ``image_tokens`` the tokens they take.
        videos: videos; ``video_tokens`` the tokens they take.
        video_lines: per video, one line of its plan (:meth:`VideoPlan.describe`).
        video_plans: per video, ``{"video", "frames", "of", "size", "grid", "tokens", "timestamps"}``:
            its name, the frames taken of how many, the resized ``[width, height]``, its
            ``video_grid_thw`` row (None without), its tokens and the seconds its processor
            writes before (after) each frame group (empty where it writes none).
    """

    where: str
    text: str
    marked: str
    trained: list[str]
    tokens: int
    trained_tokens: int
    images: int
    image_tokens: int
    videos: int
    video_tokens: int = 0
    video_plans: tuple[dict, ...] = ()
    video_lines: tuple[str, ...] = ()

    def to_json(self) -> dict:
        """``{"text", "trained", "tokens", "images", "videos"}`` and, with videos, ``"video_plans"``
        (``vlmcp data show --json``)."""
        out = {"text": self.text, "trained": self.trained, "tokens": self.tokens, "images": self.images,
               "videos": self.videos}
        if self.video_plans:
            out["video_plans"] = list(self.video_plans)
        return out

    def plain(self, max_lines: int | None = None, max_chars: int | None = None, more: str = "") -> str:
        """A header line and the marked text, cut after ``max_lines`` lines or ``max_chars``
        characters with a note that ends with ``more``."""
        head = (f"{self.where}: {self.tokens} tokens ({self.trained_tokens} trained, in {OPEN} {CLOSE}), "
                f"{self.images} image(s) ({self.image_tokens} tokens), {self.videos} video(s)"
                + (f" ({self.video_tokens} tokens)" if self.videos else ""))
        for k, (plan, line) in enumerate(zip(self.video_plans, self.video_lines, strict=True), start=1):
            head += f"\n  video {k} ({plan['video']}): {line}"
        body = self.marked
        cut = len(body)
        if max_lines is not None and body.count("\n") >= max_lines:
            cut = min(cut, [i for i, c in enumerate(body) if c == "\n"][max_lines - 1])
        if max_chars is not None:
            cut = min(cut, max_chars)
        if cut < len(body):
            body = body[:cut] + f"\n... ({len(self.marked) - cut} more characters{more})"
        return f"{head}\n{body.rstrip()}"


def view_conversation(processor, conv: Conversation, video: VideoSampling | None = None,
                      images=None) -> ConversationView:
    """The view of ``conv`` (image and video headers read, no pixel decoded).

    Args:
        processor: the model's processor.
        conv: the conversation.
        video: how videos are sampled (``--video-*``), which sets their token counts.
        images: the :class:`~vlmcp.data.hf.image_bounds.ImageBounds` images are scaled into
            (``--image-*-pixels``), which set their token counts.

    Raises:
        ValueError: naming ``file:line``, as planning would (:func:`plan_expansion`).
    """
    rendered, expansion = plan_expansion(processor, conv, video, images)
    ids, trained = expansion.ids, expansion.trained
    planned = video_plans(processor, conv, video)
    plans = [{"video": media.name, "frames": len(plan.indices), "of": plan.total,
              "size": [plan.width, plan.height],
              "grid": None if plan.grid_thw is None else list(plan.grid_thw), "tokens": plan.tokens,
              "timestamps": list(plan.timestamps)}
             for media, plan in zip(conv.videos, planned, strict=True)]
    tokenizer = processor.tokenizer
    image_id = tokenizer.convert_tokens_to_ids(processor.image_token)
    # GLM-4.1V writes video frames with the image placeholder: those are the video's tokens
    frames_as_images = sum(p.tokens for p in planned) if conv.videos and not \
        video_rules(processor).mixes_images_and_videos else 0
    markers = {"image": IMAGE_PLACEHOLDER, "video": VIDEO_PLACEHOLDER}
    # each marker stands for the characters the processor replaced (transformers 5.25's Qwen3-VL: the
    # template's vision start and end around a video too)
    edits = [(start, end, markers[kind]) for kind, start, end in expansion.spans]
    replaced = [False] * (len(rendered.text) + 1)
    for _, start, end in expansion.spans:
        replaced[start:end] = [True] * (end - start)
    run_start = None
    flags = [t and not any(replaced[s:e])
             for (s, e), t in zip(rendered.offsets, rendered.trained, strict=True)]
    for k, (start, end) in enumerate(rendered.offsets):
        if flags[k] and run_start is None:
            run_start = start
        if flags[k] and (k + 1 == len(flags) or not flags[k + 1]):
            edits += [(run_start, run_start, OPEN), (end, end, CLOSE)]
            run_start = None
    edits.sort(key=lambda e: (e[0], e[1]))

    def apply(markers: bool) -> str:
        out, at = [], 0
        for start, end, new in edits:
            if start == end and not markers:
                continue
            out += [rendered.text[at:start], new]
            at = end
        return "".join(out + [rendered.text[at:]])

    runs, current = [], []
    for token, t in zip(ids, trained, strict=True):
        if t:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    runs += [current] if current else []
    decode = lambda run: tokenizer.decode(run, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return ConversationView(where=conv.where, text=apply(False), marked=apply(True),
                            trained=[decode(r) for r in runs], tokens=len(ids), trained_tokens=sum(trained),
                            images=len(conv.images), image_tokens=ids.count(image_id) - frames_as_images,
                            videos=len(conv.videos), video_tokens=sum(p["tokens"] for p in plans),
                            video_plans=tuple(plans), video_lines=tuple(p.describe() for p in planned))


def select_line(data: ConversationSet, line: int | None, files: list[str]) -> Conversation:
    """The first conversation on ``line`` (its :attr:`Conversation.line`, the N of ``file.json:[N]``
    in a JSON list; None: the first conversation).

    Raises:
        ValueError: naming the files when no conversation is on that line (and why, when a
            format's rule skipped it).
    """
    if not data.conversations:
        raise ValueError(f"--data {', '.join(files)}: no conversation to show")
    if line is None:
        return data.conversations[0]
    for conv in data.conversations:
        if conv.line == line:
            return conv
    names = {line_name(str(Path(f)), line) for f in files}
    for skip in data.skipped:
        if skip.where in names:
            raise ValueError(f"{skip.where}: skipped when read ({skip.reason}); nothing trains from it")
    lines = sorted(c.line for c in data.conversations)
    raise ValueError(f"--line {line}: no conversation on line {line} of {', '.join(files)} (conversations "
                     f"are on lines {lines[0]}-{lines[-1]})")
