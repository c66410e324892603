"""Offline programs and their libraries (installed as vllm_selfspec.offline).

Nothing here runs inside a vLLM engine: dev sets and prompt sets, the skip-mask
search and its objectives, the transformers target, N-Grammys table builders, the
GGUF conversion of the embedded model, and the tools themselves (each module with a
``main(argv=None)``; ``tools/<name>.py`` is a thin CLI for it, and
``python -m vllm_selfspec.offline.<name>`` runs the same thing).
"""
