"""``vlmcp init-model``: a tiny random HF model directory with its tokenizer and processor, offline.

:func:`init_model` (:mod:`.writer`) writes it; :mod:`.gemma3` and :mod:`.smolvlm` hold what those two
processors need beyond the common writer.
"""

from vlmcp.debug.init_model.writer import ARCHS, CHAT_TEMPLATES, build_processor, init_model

__all__ = ["ARCHS", "CHAT_TEMPLATES", "build_processor", "init_model"]
