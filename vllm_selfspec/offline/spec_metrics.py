"""Acceptance figures from vLLM's own per-request spec-decode metrics.

With ``per_request_spec_decode_metrics="summary"`` every finished sequence
carries ``CompletionOutput.spec_decode_metrics`` (``vllm/v1/metrics/stats.py:
RequestSpecDecodeMetrics``): a histogram of accepted draft tokens per verify step
and the number of proposed draft tokens. Summed over requests this gives the
same figures as the ``vllm:spec_decode_*`` Prometheus counters, but per engine:
the Prometheus registry is per process, and a new engine unregisters the
collectors of the engines before it (``vllm/v1/metrics/prometheus.py:
unregister_vllm_metrics``), so counters cannot be compared across engines that
share a process (tools/bench.py, the tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


def engine_args(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Extra engine arguments that turn the per-request metrics on (vLLM refuses
    the flag on engines without speculative decoding)."""
    spec = kwargs.get("speculative_config") or kwargs.get("speculative_model")
    return {"per_request_spec_decode_metrics": "summary"} if spec else {}


@dataclass
class Acceptance:
    tokens: int = 0  # generated tokens
    requests: int = 0
    drafts: int = 0  # verify steps that had draft tokens
    draft_tokens: int = 0
    accepted: int = 0

    @property
    def mean_acceptance_length(self) -> float:
        """vLLM's "Mean acceptance length": 1 + accepted tokens per draft."""
        return 1.0 + self.accepted / self.drafts if self.drafts else 1.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def tokens_per_step(self) -> float:
        """Tokens per target decode step, steps without drafts included (each
        request's first token comes from prefill and is left out)."""
        decoded = self.tokens - self.requests
        # accepted drafts past a stop token are counted by vLLM but not emitted,
        # so bound the step count below by the number of verified drafts
        steps = max(decoded - self.accepted, self.drafts)
        return decoded / steps if steps > 0 else 1.0

    def add(self, other: Acceptance) -> None:
        self.tokens += other.tokens
        self.requests += other.requests
        self.drafts += other.drafts
        self.draft_tokens += other.draft_tokens
        self.accepted += other.accepted


def acceptance(outputs: Iterable[Any]) -> Acceptance:
    """Sum the per-request metrics of ``LLM.generate`` results."""
    acc = Acceptance()
    for out in outputs:
        for comp in out.outputs:
            acc.requests += 1
            acc.tokens += len(comp.token_ids)
            m = getattr(comp, "spec_decode_metrics", None)
            if m is None:
                continue
            acc.drafts += sum(m.histogram)
            acc.accepted += sum(j * c for j, c in enumerate(m.histogram))
            acc.draft_tokens += m.num_draft_tokens
    return acc
