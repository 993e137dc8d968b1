"""A conversation through the model's chat template: the text, and which of its tokens train.

Note [vlmcp data: trained tokens from the chat template]
-------------------------------------------------------
The loss covers the messages whose :attr:`Message.trained` is true (assistant turns and
tool calls unless a line says ``"loss": false``; any turn a line marks ``"loss": true``).
Chat templates do not mark them (the hub's Qwen2-VL and LLaVA templates have no
``{% generation %}`` tags), so the spans come from rendering prefixes, which works for any
template that renders a conversation left to right::

    render(messages[:i], add_generation_prompt=True)  = P      "...<|im_start|>assistant\\n"
    render(messages[:i + 1])                          = P + A  "...assistant\\na red circle<|im_end|>\\n"
    render(messages)                                  starts with P + A

so message i's characters are ``[len(P), len(P + A))`` of the full text (its end-of-turn
token included: a model must learn to stop). For an assistant turn (``assistant``,
``tool_call``) ``P`` ends with the generation prompt, which is the prompt, not the answer;
any other trained turn (a user turn with ``"loss": true``) is rendered without it, so its
span is the whole turn, role header included. The text is tokenized once with offsets; a
token is a target when its first character lies in a span. Each image placeholder token
is then expanded to the image's token count, which must reproduce the processor's own
``input_ids`` exactly (checked in :mod:`vlmcp.data.hf.encode`), so the labels line up with
what the model sees.

Before any span is taken, every message must be in the rendered text, in order: each
text piece of its content (between image placeholders, stripped), and a tool call's name,
argument names and values. A template that drops a message (no system slot, no tool
support: the Qwen2-VL template ignores ``tool_calls``) would train the model on something
other than the line, silently; it is an error naming ``file:line`` and the message.

Roles reach the template as the hub's tool-use convention has them: ``tool_call`` is an
assistant message ``{"tool_calls": [{"type": "function", "function": {"name", "arguments"}}]}``
(the content's JSON, one call or a list), ``tool_response`` is role ``tool``; contents are
typed parts (``{"type": "text"}``, ``{"type": "image"}``), as VLM templates expect. A line's
``tools`` (schemas) go to the template's ``tools``; each tool's name and description must
be in the rendered text too.

A line's newline right after an image (LLaVA's ``<image>\\n``, which the LLaVA reader
normalises to) meets a template that writes its own (the HF LLaVA template writes
``<image>\\n`` for each image part): kept, it would give two newlines at training and one
at inference. So when the template writes one (:func:`newline_after_image`), the line's is
dropped; a template that writes none (Qwen's) keeps the line's text as it is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from vlmcp.data.hf.schema import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER, Conversation, Message

__all__ = ["Rendered", "chat_messages", "chat_tools", "newline_after_image", "render"]

_HF_ROLES = {"system": "system", "user": "user", "assistant": "assistant", "tool_call": "assistant",
             "tool_response": "tool"}
"""vlmcp's roles -> the roles chat templates know (a tool call is an assistant message)."""
_PLACEHOLDERS = re.compile(f"({re.escape(IMAGE_PLACEHOLDER)}|{re.escape(VIDEO_PLACEHOLDER)})")


def _parts(content: str, own_newline: bool) -> list[dict]:
    """``"a <image> b"`` -> ``[{"type": "text", "text": "a "}, {"type": "image"}, {"type": "text", ...}]``;
    with ``own_newline``, one newline right after a placeholder is the template's to write."""
    parts = []
    for piece in _PLACEHOLDERS.split(content):
        if piece in (IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER):
            parts.append({"type": piece[1:-1]})
            continue
        if own_newline and parts and parts[-1]["type"] != "text" and piece.startswith("\n"):
            piece = piece[1:]
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def newline_after_image(processor) -> bool:
    """Whether the chat template writes a newline after each image itself (LLaVA's writes
    ``<image>\\n``), found by rendering one image followed by text."""
    probe = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "@@"}]}]
    text = processor.apply_chat_template(probe, tokenize=False)
    image = processor.image_token
    if image not in text or "@@" not in text:
        return False
    return "\n" in text[text.rindex(image) + len(image):text.rindex("@@")]


def _tool_calls(message: Message, where: str, k: int) -> list[dict]:
    """A ``tool_call`` message's JSON (one call or a list) -> the chat template's ``tool_calls``."""
    try:
        calls = json.loads(message.content)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: message {k} (tool_call) is not JSON ({err.msg}); it must be "
                         "{\"name\": ..., \"arguments\": {...}}") from None
    out = []
    for call in calls if isinstance(calls, list) else [calls]:
        args = call.get("arguments", {}) if isinstance(call, dict) else None
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = None
        if not (isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(args, dict)):
            raise ValueError(f"{where}: message {k} (tool_call) must be {{\"name\": str, \"arguments\": "
                             f"object}} (or a list of them), got {message.content!r}")
        out.append({"type": "function", "function": {"name": call["name"], "arguments": args}})
    return out


def chat_messages(conv: Conversation, own_newline: bool = False) -> list[dict]:
    """The conversation as ``apply_chat_template`` takes it (content as typed parts).

    ``own_newline``: the template writes a newline after each image (:func:`newline_after_image`),
    so the line's own newline there (LLaVA's ``<image>\\n``) is dropped rather than doubled.
    """
    out = []
    for k, m in enumerate(conv.messages):
        if m.role == "tool_call":
            out.append({"role": "assistant", "tool_calls": _tool_calls(m, conv.where, k)})
        else:
            out.append({"role": _HF_ROLES[m.role], "content": _parts(m.content, own_newline)})
    return out


def chat_tools(conv: Conversation) -> list[dict] | None:
    """The line's tool schemas in the hub's form, ``{"type": "function", "function": {...}}``."""
    if not conv.tools:
        return None
    return [t if "function" in t else {"type": "function", "function": t} for t in json.loads(conv.tools)]


def _check_tools_rendered(text: str, conv: Conversation, tools: list[dict] | None) -> None:
    """Each tool schema's name and description somewhere in ``text`` (the template's tool slot)."""
    for tool in tools or ():
        function = tool["function"]
        for needle in (function["name"], function.get("description")):
            if isinstance(needle, str) and needle.strip() and needle.strip() not in text:
                raise ValueError(f"{conv.where}: the chat template of this model drops the tools (tool "
                                 f"{function['name']!r}: {needle.strip()[:60]!r} is not in the rendered "
                                 "text), so training would not see them; use a model whose chat template "
                                 "renders tools, or remove \"tools\"")


def _leaves(value) -> list[str]:
    """The names and values of a tool call's arguments, as a template may print them."""
    if isinstance(value, dict):
        return [s for key, v in value.items() for s in (key, *_leaves(v))]
    if isinstance(value, list):
        return [s for v in value for s in _leaves(v)]
    return [value] if isinstance(value, str) else [json.dumps(value)]


def _check_every_message_rendered(text: str, conv: Conversation, messages: list[dict]) -> None:
    """Each message's text (a call's name and arguments) in ``text``, in order (see the Note)."""
    at = 0
    for k, (m, hf) in enumerate(zip(conv.messages, messages, strict=True)):
        if m.role == "tool_call":
            needles = [s for call in hf["tool_calls"]
                       for s in (call["function"]["name"], *_leaves(call["function"]["arguments"]))]
        else:
            needles = [p["text"].strip() for p in hf["content"] if p["type"] == "text"]
        for needle in filter(None, needles):
            # a value may be printed raw or as JSON (escaped quotes and newlines)
            forms = dict.fromkeys((needle, json.dumps(needle, ensure_ascii=False)[1:-1]))
            found = [(i, i + len(form)) for form in forms if (i := text.find(form, at)) >= 0]
            if not found:
                raise ValueError(f"{conv.where}: the chat template of this model drops the {m.role} message "
                                 f"{k} (or moves it out of order): {needle[:60]!r} is not in the rendered "
                                 "text, so training would not see it; use a model whose chat template "
                                 "renders it, or remove the message")
            at = min(found)[1]


@dataclass(frozen=True)
class Rendered:
    """A conversation as the chat template writes it, tokenized (images not expanded).

    Attributes:
        text: the chat template's output.
        ids: the tokenizer's ids of ``text``; one image (video) token per image (video).
        offsets: each token's ``(start, end)`` characters in ``text``.
        trained: per token, whether it carries loss.
    """

    text: str
    ids: list[int]
    offsets: list[tuple[int, int]]
    trained: list[bool]


def _media_text(processor, kind: str, where: str) -> str:
    """What the chat template writes for one image (video) part, found between two text parts."""
    parts = [{"type": "text", "text": "A"}, {"type": kind}, {"type": "text", "text": "B"}]
    text = processor.apply_chat_template([{"role": "user", "content": parts}], tokenize=False)
    token = getattr(processor, f"{kind}_token", None)
    start, end = text.find("A"), text.rfind("B")
    piece = text[start + 1:end] if 0 <= start < end else ""
    if not token or piece.count(token) != 1:
        article = "an" if kind == "image" else "a"
        raise ValueError(f"{where}: a pre-training line with {kind}s: {type(processor).__name__}'s chat "
                         f"template does not write {article} {kind} part in place, so vlmcp cannot place it "
                         "in plain text")
    return piece


def _render_plain(processor, conv: Conversation) -> Rendered:
    """A pre-training line (:attr:`Conversation.pretrain`): its text as plain text, each image and
    video as the chat template writes one, then the end-of-text token. The line's text and the
    end-of-text token train; what the template writes for an image or video does not."""
    kinds = {IMAGE_PLACEHOLDER: "image", VIDEO_PLACEHOLDER: "video"}
    eos = processor.tokenizer.eos_token
    if not eos:
        raise ValueError(f"{conv.where}: a pre-training line needs the tokenizer's end-of-text token")
    full, spans = "", []
    for piece in [*_PLACEHOLDERS.split(conv.messages[0].content), None]:
        if piece in kinds:
            full += _media_text(processor, kinds[piece], conv.where)
            continue
        piece = eos if piece is None else piece
        spans.append((len(full), len(full) + len(piece)))
        full += piece
    enc = processor.tokenizer(full, return_offsets_mapping=True)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    trained = [e > s and any(a <= s < b for a, b in spans) for s, e in offsets]
    return Rendered(text=full, ids=list(enc["input_ids"]), offsets=offsets, trained=trained)


def render(processor, conv: Conversation) -> Rendered:
    """Render ``conv`` with the model's chat template and find its trained tokens (see the Note).

    Raises:
        ValueError: naming ``file:line`` when the conversation has no trained message, a
            malformed tool call, or the template drops a message or does not render left to
            right. (A template that drops an image or video part is caught where the
            placeholders are expanded, :mod:`vlmcp.data.hf.encode`.)
    """
    if not any(m.trained for m in conv.messages):
        raise ValueError(f"{conv.where}: no message carries loss, so nothing to learn")
    if conv.pretrain:
        return _render_plain(processor, conv)
    own_newline = bool(conv.images or conv.videos) and newline_after_image(processor)
    messages, tools = chat_messages(conv, own_newline), chat_tools(conv)

    def text(k: int, prompt: bool) -> str:
        if k == 0:
            return ""
        return processor.apply_chat_template(messages[:k], tools=tools, tokenize=False,
                                             add_generation_prompt=prompt)

    full = text(len(messages), False)
    _check_every_message_rendered(full, conv, messages)
    _check_tools_rendered(full, conv, tools)
    spans = []
    for k, m in enumerate(conv.messages):
        if not m.trained:
            continue
        prompt, turn = text(k, messages[k]["role"] == "assistant"), text(k + 1, False)
        if not (turn.startswith(prompt) and full.startswith(turn)):
            raise ValueError(f"{conv.where}: the chat template does not render this conversation left to "
                             f"right, so its trained messages cannot be found (message {k}, {m.role})")
        spans.append((len(prompt), len(turn)))
    enc = processor.tokenizer(full, return_offsets_mapping=True)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    trained = [any(s <= start < e for s, e in spans) for start, _ in offsets]
    return Rendered(text=full, ids=list(enc["input_ids"]), offsets=offsets, trained=trained)
