"""What the engine needs from a way to propose tokens (Proposer), and which one its
config asks for (SpeculativeConfig): checked before any weights load, built after the
target's runner (a draft model's KV pool is sized from the target's)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import torch

from engine.checkpoint.resolve import load_config, resolve_model_path
from engine.config import EngineConfig, ModelConfig, ProgressFn
from engine.sequence import ScheduledSeq, Sequence
from engine.speculative.draft import Speculator, check_same_vocabulary
from engine.speculative.ngram import NgramProposer
from engine.tokenizer import Tokenizer

NGRAM = "ngram"  # the `draft` that asks for n-gram prompt lookup instead of a draft model


class Proposer(Protocol):
    """What the engine needs from a way to propose tokens."""
    method: str  # "draft" or "ngram", for the trace

    def lookahead(self, seq: Sequence, k: int) -> int:
        """How many proposals seq will verify in its next round (at most k). It must
        depend on seq alone, so a seeded request's rounds are the same in any batch."""

    def propose(self, items: list[ScheduledSeq]) -> None:
        """Fill each item's draft_tokens and draft_probs (q, [V] each) with its proposals."""

    def accept(self, seq: Sequence, real_len: int, accepted: int, token_ids: list[int]) -> None:
        """After verification: `accepted` proposals survived; token_ids are the kept tokens."""

    def free(self, seq: Sequence) -> None:
        """Forget seq's state: it finished, was aborted, or was preempted."""

    def describe(self, seq: Sequence, piece: Callable[[int], str]) -> dict:
        """What the `spec` event adds about seq's last round: the method, and its details
        (piece: a token's text)."""


@dataclass(frozen=True)
class SpeculativeConfig:
    """The engine's `draft` argument, resolved: n-gram prompt lookup, or a draft checkpoint
    that shares the target's vocabulary."""
    method: str  # "ngram" or "draft"
    num_speculative_tokens: int  # k: proposals per round, at most
    prompt_lookup_max: int
    prompt_lookup_min: int
    draft_path: Path | None = None
    draft_config: ModelConfig | None = None

    @classmethod
    def resolve(cls, draft: str | Path | None, num_speculative_tokens: int, prompt_lookup_max: int,
                prompt_lookup_min: int, tokenizer: Tokenizer, cfg: ModelConfig) -> "SpeculativeConfig | None":
        """None without a draft. Raises before any weights load when the draft cannot serve."""
        if draft is None:
            return None
        spec = cls(NGRAM, num_speculative_tokens, prompt_lookup_max, prompt_lookup_min)
        if draft != NGRAM:
            path = resolve_model_path(draft)
            draft_cfg = load_config(path)
            check_same_vocabulary(tokenizer, cfg, Tokenizer(path), draft_cfg, path)
            spec = cls("draft", num_speculative_tokens, prompt_lookup_max, prompt_lookup_min, path, draft_cfg)
        if num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be >= 1")
        return spec

    @property
    def max_positions(self) -> int | None:
        """The draft model's context, which bounds the engine's (None: n-gram lookup has none)."""
        return self.draft_config.max_position_embeddings if self.draft_config is not None else None

    def build(self, config: EngineConfig, target_blocks: int, max_model_len: int, vocab_size: int,
              dtype: torch.dtype, device: torch.device, progress: ProgressFn | None = None) -> Proposer:
        """The proposer, beside a target runner of `target_blocks` KV blocks."""
        if self.method == NGRAM:
            return NgramProposer(self.prompt_lookup_max, self.prompt_lookup_min, vocab_size, device)
        return Speculator.build(self.draft_path, self.draft_config, config, target_blocks, self.num_speculative_tokens,
                                max_model_len, dtype, device, progress)
