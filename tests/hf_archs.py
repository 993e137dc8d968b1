"""The architectures each HF test file covers (model types of :mod:`vlmcp.debug.tiny`'s registry)."""

TINY_ARCHS = ("qwen2_vl", "qwen2_5_vl", "llava")
"""The generic HF tests (``tests/test_hf.py``)."""
MROPE_ARCHS = ("qwen3_vl", "qwen3_vl_moe", "glm4v")
"""Interleaved M-RoPE (Qwen3-VL with deepstack, its MoE variant, GLM-4.1V; ``tests/test_hf_qwen3.py``)."""
ANYRES_ARCHS = ("internvl", "llava_onevision", "llava_next", "smolvlm", "idefics3", "mistral3")
"""Any-resolution families (``tests/test_hf_more_archs.py``)."""
NEW_ARCHS = ("gemma4", "glm4v_moe", "glm46v", "mistral4", "minimax_m3_vl", "llama4")
"""Issue 27's architectures (``tests/test_hf_new_archs.py``)."""
