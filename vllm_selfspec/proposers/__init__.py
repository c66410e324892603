"""The papers' drafting algorithms, one module each (installed as vllm_selfspec.proposers).

They depend only on torch and the contract in ``base``; ``vllm_selfspec`` adapts
vLLM's runner to that contract.
"""
