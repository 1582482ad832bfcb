"""Drive the engine's model runner by hand: the whole prompt in chunks of a chosen
size through the paged cache, returning the logits at every position. DEVICE: where
the engine tests run (TOKENTRACE_TEST_DEVICE=cuda on a GPU machine; CPU by default)."""
from __future__ import annotations

import os

import torch

from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledSeq
from engine.sequence import Sequence
from engine.tokenizer import IncrementalDetokenizer

DEVICE = os.environ.get("TOKENTRACE_TEST_DEVICE", "cpu")


def chunked_logits(engine: LLMEngine, ids: list[int], chunk: int) -> torch.Tensor:
    bm, runner = engine.block_manager, engine.runner
    seq = Sequence("parity", list(ids), SamplingParams(), IncrementalDetokenizer.start(engine.tokenizer, ids))
    bm.admit(seq, [])
    out = []
    try:
        while seq.num_computed_tokens < len(ids):
            start = seq.num_computed_tokens
            n = min(chunk, len(ids) - start)
            bm.allocate(seq, n)
            batch = runner.prepare([ScheduledSeq(seq, start, n)], [None])
            out.append(runner.run(batch))
            seq.num_computed_tokens += n
    finally:
        bm.free_seq(seq)
    return torch.cat(out).cpu()  # compared with references computed on the CPU
