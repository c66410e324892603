"""N-Grammys with earlier requests as a draft source (method ``ngrammys-history``).

A composition, not the paper's algorithm, so it has its own method name
(``ngrammys`` stays faithful to N-Grammys). The candidate rows of one step, first one
drafted, are:

* N-Grammys §4.2 context n-grams: the last q tokens looked up in the request's own
  context, the tokens that followed a match proposed;
* where the context has no match, earlier requests (``proposers.past_requests``,
  SuffixDecoding §3's global tree idea): the longest suffix of the request (8 down to
  2 tokens) found in the prompts and outputs this engine has finished, up to
  ``history_tokens`` tokens kept (oldest evicted first);
* where neither has a match, a datastore (``proposers.datastore``, REST §3): the
  longest suffix of the request (8 down to 2 tokens) in a fixed corpus — by default
  ShareGPT's first answers in the model's tokens (~3M tokens, built at start-up and
  cached) — and the continuation most of its occurrences agree on;
* N-Grammys §4.3 extended-bigram rows of the newest token (the model-derived table).

It is ``ngrammys`` with ``history_tokens`` and ``datastore`` on: the same proposer, keys
and evidence classes (the cost gate prices "history" and "datastore" drafts apart).
Earlier answers add most on HumanEval, where code shares idioms across requests, and
little on MT-bench (docs/paper-checks.md, earlier requests); the datastore adds more on
MT-bench than on HumanEval next to them (docs/results.md, "The datastore, replayed").
"""

from __future__ import annotations

from dataclasses import dataclass

from .ngrammys import DATASTORE_HELP, HISTORY_HELP, SHAREGPT, NGrammysOptions, NGrammysProposer
from .options import option
from .past_requests import DEFAULT_HISTORY_TOKENS


@dataclass(frozen=True)
class NGrammysHistoryOptions(NGrammysOptions):
    """Method ``ngrammys-history``'s keys: ``ngrammys``' keys, earlier requests and the
    ShareGPT datastore on."""

    history_tokens: int = option(DEFAULT_HISTORY_TOKENS, HISTORY_HELP, "int", 0, None)
    datastore: str = option(SHAREGPT, DATASTORE_HELP, "str")


class NGrammysHistoryProposer(NGrammysProposer):
    """Method ``ngrammys-history``: context rows, else earlier requests, else bigram rows."""

    options_class = NGrammysHistoryOptions
