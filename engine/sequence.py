"""The state of one request inside the engine."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum, auto

import torch

from engine.logprobs import TokenLogprob
from engine.sampling_params import SamplingParams
from engine.tokenizer import IncrementalDetokenizer
from engine.trace.capture import CaptureSpec


class Status(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    capture: CaptureSpec | None = None
    trace_level: str = "off"  # "off" | "basic" | "full"
    prompt: str | None = None
    status: Status = Status.WAITING
    token_ids: list[int] = field(default_factory=list)  # prompt + generated
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # of those, taken from the prefix cache at (last) admission
    block_table: list[int] = field(default_factory=list)
    text: str = ""  # detokenized output so far (stop strings cut off)
    streamed_chars: int = 0
    finish_reason: str | None = None
    stopped_by_string: bool = False
    generator: torch.Generator | None = None
    num_preemptions: int = 0
    speculative: bool = False  # verify draft proposals in decode steps
    spec_k: int | None = None  # proposals per round (None: the engine's k)
    spec_proposed: int = 0
    spec_accepted: int = 0
    # params.prompt_logprobs: each prompt position's (1..) log-probabilities, filled as prefill chunks run
    prompt_logprobs: dict[int, "TokenLogprob"] = field(default_factory=dict)
    # params.n > 1: the other choices, forked once this one's prompt is computed (LLMEngine._fork)
    forks: list["Sequence"] = field(default_factory=list)
    grammar: object | None = None  # params.structured: its engine/structured.py Matcher
    # timing (time.perf_counter): arrival, tokenize done, first scheduled, each token
    arrival_time: float = field(default_factory=time.perf_counter)
    tokenized_time: float = 0.0
    first_scheduled_time: float = 0.0
    prefill_done_time: float = 0.0
    first_token_time: float = 0.0
    first_token_drawn_time: float = 0.0  # disaggregated: its draw on the prefill side (first_token_time: here)
    token_times: list[float] = field(default_factory=list)
    # a traced request's: the engine thread's tracing seconds so far (StepTrace.total) at its
    # arrival, then as each token was drawn; their differences are what watching added to its times
    trace_clock: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == Status.FINISHED

    @property
    def traced(self) -> bool:
        return self.trace_level != "off"


@dataclass
class ScheduledSeq:
    seq: Sequence
    start: int  # first position computed this step
    num_tokens: int  # tokens computed this step, draft proposals included
    num_draft: int = 0  # speculative decoding: proposals verified in this pass
    draft_tokens: list[int] = field(default_factory=list)  # the proposals (not yet in seq.token_ids)
    draft_probs: list = field(default_factory=list)  # the draft's distribution at each proposal

    @property
    def samples(self) -> bool:
        """Does this chunk reach the end of the sequence, so a token is drawn?"""
        return self.start + self.num_tokens - self.num_draft == len(self.seq)

    @property
    def kind(self) -> str:
        if self.num_draft:
            return "verify"
        return "decode" if self.start >= self.seq.num_prompt_tokens and self.num_tokens == 1 else "prefill"

    def token_ids(self) -> list[int]:
        """This step's input ids; positions past the real tokens read the proposals."""
        start, end, ids = self.start, self.start + self.num_tokens, self.seq.token_ids
        n = len(ids)
        if end <= n:
            return ids[start:end]
        return ids[start:] + self.draft_tokens[max(0, start - n):end - n]
