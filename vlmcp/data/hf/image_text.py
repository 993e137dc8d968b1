"""What the processor writes for each image of a conversation, from the image's size alone.

At training the processor writes an image's text with its ``replace_image_token`` on the
image processor's outputs; planning has only the header's size, so the text comes from the
processor's own counts (``_get_num_multimodal_tokens``) and, where the text is more than a
run of its image token, from the processor's own pieces:

* most processors (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4.1V, LLaVA, LLaVA-OneVision): the
  image token, as many times as the processor counts (LLaVA-OneVision's multi-image samples: a
  base tile and one newline per image, as its ``replace_image_token``);
* InternVL: its own ``replace_image_token`` on the tile count it reports (``<img>``, the
  context tokens, ``</img>``; transformers 5.24 counts the two frame tokens, 5.25 does not);
* Gemma 3: its ``full_image_sequence``; SmolVLM: its crops' rows and the global image
  (``get_image_prompt_string`` on its image processor's crop grid for the size).

Each rule is compared with the processor's own output on every ``vlmcp init-model``
architecture (``tests/test_demo_data.py``), and a run compares them again on the first
conversation of each kind before any rank starts (:func:`vlmcp.data.hf.planned.check_planned`).
"""

from __future__ import annotations

from vlmcp.data.hf.schema import Conversation, MediaError

__all__ = ["image_texts", "image_token_counts"]


def image_token_counts(processor, conv: Conversation, sizes: list[tuple[int, int]]) -> list[int]:
    """Tokens of each image of ``conv`` at the given sizes (the processor's rule, no pixels): the
    same on every transformers version (InternVL: the tokens of its own text, markers included).

    Raises:
        MediaError: when the processor refuses an image's size (e.g. Qwen's aspect ratio > 200).
    """
    counts = []
    for media, size in zip(conv.images, sizes, strict=True):
        try:
            if type(processor).__name__ == "SmolVLMProcessor":  # no _get_num_multimodal_tokens: its text's
                counts.append(_smolvlm_text(processor, size).count(processor.image_token))
                continue
            if _frames_images(processor):  # its count: 5.24 holds <img> and </img>, 5.25 does not
                text = _framed_text(processor, size)
                counts.append(len(processor.tokenizer(text, add_special_tokens=False)["input_ids"]))
                continue
            counts.append(int(processor._get_num_multimodal_tokens(image_sizes=[size]).num_image_tokens[0]))
        except Exception as err:  # the processor's own checks (smart_resize, ...)
            raise MediaError(conv.where, media.name, "the processor refuses image", err) from None
    if len(counts) > 1 and type(processor).__name__ == "LlavaOnevisionProcessor":
        # each image of a multi-image sample is its base tile and one newline
        # (LlavaOnevisionProcessor.replace_image_token; _get_num_multimodal_tokens counts it tiled)
        one = processor.num_image_tokens + 1 - (processor.vision_feature_select_strategy == "default")
        counts = [one] * len(counts)
    return counts


def _smolvlm_text(processor, size: tuple[int, int]) -> str:
    """The text SmolVLM's processor writes for an image of ``size`` (``(height, width)``): its crops'
    ``<fake_token_around_image><row_i_col_j>`` + ``image_seq_len`` ``<image>``, ``"\\n"`` after each
    row, then ``"\\n"`` and the global image (the global image alone when the image is not split)."""
    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    _, rows, cols = processor.image_processor.get_number_of_image_patches(*size)
    return get_image_prompt_string(rows, cols, processor.image_seq_len, processor.fake_image_token,
                                   processor.image_token, processor.global_image_token)


def _frames_images(processor) -> bool:
    """Whether the processor writes ``<img>`` and ``</img>`` around an image's tokens (InternVL)."""
    return getattr(processor, "start_image_token_id", None) is not None


def _framed_text(processor, size: tuple[int, int]) -> str:
    """InternVL's own ``replace_image_token`` on the tiles it cuts an image of ``size`` into."""
    patches = processor._get_num_multimodal_tokens(image_sizes=[size]).num_image_patches
    return processor.replace_image_token({"num_patches": [int(patches[0])]}, 0)


def image_texts(processor, conv: Conversation, sizes: list[tuple[int, int]]) -> list[str]:
    """The text the processor writes for each image of ``conv`` at ``sizes`` (module docstring).

    Raises:
        MediaError: the processor refuses an image's size.
        ValueError: naming ``file:line`` when the processor's pieces hold other counts of image
            tokens than it counts.
    """
    counts = image_token_counts(processor, conv, sizes)
    name = type(processor).__name__
    if _frames_images(processor):
        return [_framed_text(processor, size) for size in sizes]
    if name == "SmolVLMProcessor":
        texts = [_smolvlm_text(processor, size) for size in sizes]
    elif isinstance(getattr(processor, "full_image_sequence", None), str):  # Gemma 3
        texts = [processor.full_image_sequence] * len(sizes)
    else:
        return [processor.image_token * n for n in counts]
    soft = getattr(processor.tokenizer, "image_token", None) or processor.image_token  # Gemma 3: soft tokens
    per_image = [text.count(soft) for text in texts]
    if counts != per_image:
        raise ValueError(f"{conv.where}: images of {counts} tokens, but the processor writes {per_image}")
    return texts
