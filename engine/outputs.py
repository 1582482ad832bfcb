"""What the engine hands back: streamed token deltas and finished requests."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.logprobs import TokenLogprob


@dataclass
class TokenOutput:
    """One new token of one request, the moment it exists."""
    request_id: str
    token_id: int
    text: str  # newly visible text (may be "" while a character or stop string is pending)
    index: int  # 0-based position among the generated tokens
    time: float  # seconds since the request arrived
    finished: bool = False
    finish_reason: str | None = None
    logprobs: TokenLogprob | None = None  # params.logprobs: this token's (raw logits' log-softmax)
    # params.prompt_logprobs, on a request's first output: one per prompt token (the first: None)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # the engine step it was made in, as its trace events number it (made between steps, as a
    # disaggregated first token or an abort: the last step's number, as its events have it)
    step: int = 0


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated ids
    text: str
    finish_reason: str | None
    usage: Usage
    metrics: dict = field(default_factory=dict)  # ttft, its split, per-token latencies
