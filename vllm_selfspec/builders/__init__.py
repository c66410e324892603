"""What an engine builds at start-up when the user gives no artifact, shared with the offline
tools: the embedded models' conversion from their GGUF (``models``), the bigram table of
``ngrammys`` (``bigram``), the REST datastore of ``ngrammys-history`` (``datastore``) from
ShareGPT (``sharegpt``) without any benchmark text (``benchmark_filter``, over the prompt
sets of ``datasets``).

Imports neither vLLM nor ``vllm_selfspec.offline`` (tests/unit/test_imports.py): the engine's
start-up path reaches these modules, never the tools'.
"""
