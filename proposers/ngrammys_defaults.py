"""Defaults of method ``ngrammys`` (pure Python: the config layer reads them at start-up).

Chosen offline on the dev split with ``tools/ngrammys_calls.py`` (README, "ngrammys").
"""

SELECTIONS = ("first", "likelihood")

DEFAULTS = {
    "width": 8,  # num_speculative_tokens: the chain, and the width of context rows
    "num_rows": 10,  # k
    "bigram_width": 2,
    "query_length": 3,  # q, tried down to min_query_length
    "min_query_length": 1,
    "selection": "first",
    "keep_rows": False,
}
