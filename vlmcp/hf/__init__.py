"""Hugging Face transformers VLMs under vlmcp (``pip install vlmcp[hf]``)."""
