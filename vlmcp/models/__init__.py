"""Step 3 of the data flow and the reference model users copy.

* :class:`VLM` (:class:`VLMConfig`): ViT + projector + decoder LLM whose attention
  runs through :func:`vlmcp.cp_attention`.
* :func:`merge_embeddings`: put the complete image embeddings into a rank's local row.
"""

from vlmcp.models.llm import DecoderLLM, LLMConfig
from vlmcp.models.merge import image_rows, merge_embeddings
from vlmcp.models.vlm import VLM, VLMConfig

__all__ = ["VLM", "DecoderLLM", "LLMConfig", "VLMConfig", "image_rows", "merge_embeddings"]
