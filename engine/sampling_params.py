from __future__ import annotations

from dataclasses import dataclass, field

from engine.structured import Constraint

MAX_LOGPROBS = 20  # top log-probabilities per token (OpenAI's top_logprobs bound; vLLM's default max_logprobs)


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop (vLLM's names and meanings).

    temperature 0 is greedy. top_k 0 (or -1) and top_p 1 and min_p 0 disable those cuts.
    Before temperature, in vLLM's order, the logits may be adjusted (engine/penalties.py):
    min_tokens (end-of-sequence and stop ids masked until that many tokens exist), logit_bias
    (token id -> added to its logit), repetition_penalty (vLLM's and transformers': prompt and
    output tokens' logits divided by it when positive, multiplied when negative; 1 is off),
    frequency_penalty and presence_penalty (OpenAI's: over the output tokens, the count times
    the first plus the second once; 0 is off).
    logprobs: how many top log-probabilities to report with each new token (None: none; 0:
    the chosen token's alone); prompt_logprobs: the same for each prompt token (the first has
    none). Both are the log-softmax of the model's raw logits (vLLM's default, "raw").
    """
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 64
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    min_tokens: int = 0
    logit_bias: dict[int, float] = field(default_factory=dict)
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    structured: Constraint | None = None  # structured output: a grammar masks each step (Constraint)
    n: int = 1  # choices from one prompt: the prompt is prefilled once, each choice draws its own tokens

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.top_k == -1:
            self.top_k = 0
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 or -1 disables it), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens = {self.max_tokens}], got {self.min_tokens}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if any(not -100 <= b <= 100 for b in self.logit_bias.values()):
            raise ValueError("logit_bias values must be in [-100, 100]")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None and not 0 <= getattr(self, name) <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {getattr(self, name)}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def adjusts_logits(self) -> bool:
        """Whether any stage before temperature changes the logits (engine/penalties.py)."""
        return bool(self.min_tokens or self.logit_bias or self.repetition_penalty != 1.0
                    or self.frequency_penalty or self.presence_penalty or self.structured)
