"""How far an engine's answers move from a reference engine's, on a fixed text fed in
(teacher forcing). The quantized section and tests/engine/checkpoint/test_quantization.py use these."""
from __future__ import annotations

import torch

from benchmarks.bench.context import TEXT
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledSeq
from engine.sequence import Sequence
from engine.tokenizer import IncrementalDetokenizer


def prompt_logits(engine: LLMEngine, ids: list[int]) -> torch.Tensor:
    """Logits [len(ids), V] at every position of `ids`, fed in as one prefill chunk (teacher
    forcing); the chunk's KV pages are freed again."""
    bm = engine.block_manager
    seq = Sequence("teacher-forced", list(ids), SamplingParams(), IncrementalDetokenizer.start(engine.tokenizer, ids))
    bm.admit(seq, [])
    try:
        bm.allocate(seq, len(ids))
        with torch.inference_mode():
            return engine.runner.run(engine.runner.prepare([ScheduledSeq(seq, 0, len(ids))], [None])).float().cpu()
    finally:
        bm.free_seq(seq)


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
