"""Engine: what a server, LLM and a lab use of an engine, as a Protocol.

LLMEngine (one engine in this process) and DisaggEngine (prefill engines in processes of
their own, decode engines here: it holds an LLMEngine as its decode core) both satisfy it;
neither derives from the other. What is not here is an engine's own parts, free to change.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Protocol, runtime_checkable

from engine.info import EngineInfo, EngineLoad
from engine.outputs import RequestOutput, TokenOutput
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.tokenizer import Tokenizer
from engine.trace import Tracer


@runtime_checkable
class Engine(Protocol):
    tokenizer: Tokenizer
    tracer: Tracer | None
    model_path: Path
    max_model_len: int
    num_speculative_tokens: int

    @property
    def step_count(self) -> int: ...  # steps taken so far (a trace event's step)

    @property
    def requests(self) -> Mapping[str, Sequence]: ...  # live, and finished ones until released (read only)

    def add_request(self, prompt: str | list[int] | None = None, params: SamplingParams | None = None, *,
                    messages: list[dict] | None = None, request_id: str | None = None,
                    trace_level: str | None = None, speculative: bool = True,
                    num_speculative_tokens: int | None = None, context_fit: str = "run") -> str: ...

    def abort(self, request_id: str) -> bool: ...

    def step(self) -> list[TokenOutput]: ...

    def has_unfinished_requests(self) -> bool: ...

    def get_output(self, request_id: str) -> RequestOutput: ...

    def release(self, request_id: str) -> None: ...

    def live_requests(self) -> list[str]: ...

    def stop_captures(self, request_id: str, limit_bytes: int) -> bool: ...

    def cached_prefix_tokens(self, token_ids: list[int]) -> int: ...

    def describe(self) -> EngineInfo: ...

    def load(self) -> EngineLoad: ...

    def shutdown(self) -> None: ...
