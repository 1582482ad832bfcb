"""How far an engine's answers move from a reference engine's, on a fixed text fed in
(teacher forcing: engine/forward.py's prompt_logits). The quantized section and
tests/engine/checkpoint/test_quantization.py use these."""
from __future__ import annotations

import torch

from benchmarks.bench.context import TEXT
from engine.llm_engine import LLMEngine


def agreement(ref: torch.Tensor, logits: torch.Tensor) -> tuple[float, float]:
    """Share of positions whose top token is the reference's, and the mean KL(ref || logits)
    of the next-token distributions, in nats."""
    top1 = (ref.argmax(-1) == logits.argmax(-1)).float().mean().item()
    kl = torch.nn.functional.kl_div(logits.log_softmax(-1), ref.log_softmax(-1), log_target=True,
                                    reduction="none").sum(-1).mean().item()
    return top1, kl


def text_ids(engine: LLMEngine) -> list[int]:
    """The bench's fixed text as token ids, cut to the engine's per-step token budget."""
    ids = engine.tokenizer.encode(TEXT, add_special_tokens=False)
    return ids[:engine.config.max_num_batched_tokens]
