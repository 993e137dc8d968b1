"""``vlmcp init-model``: a tiny random HF model directory with its tokenizer and processor, offline.

:func:`init_model` (:mod:`.writer`) writes it; :mod:`.templates` holds each architecture's special
tokens and chat template; :mod:`.gemma3`, :mod:`.smolvlm` and :mod:`.glm4v` what those processors need
beyond the common writer.
"""

from vlmcp.debug.init_model.templates import CHAT_TEMPLATES
from vlmcp.debug.init_model.writer import ARCHS, build_processor, init_model

__all__ = ["ARCHS", "CHAT_TEMPLATES", "build_processor", "init_model"]
