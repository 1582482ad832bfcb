"""Forward passes outside the scheduler: an engine's runner and KV pool driven by hand, for
teacher forcing (the logits at every position of a fixed text), parity checks against
other implementations, and tests of the pass itself (CUDA graphs, the fused layers).

    seq = forward.admit(engine, ids)        # a sequence of its own in the KV pool
    logits = forward.run(engine, [seq])     # its tokens, one pass: logits at every row
    engine.block_manager.free_seq(seq)

    forward.prompt_logits(engine, ids, chunk=5)   # the same in passes of 5 tokens, pages freed

Nothing here is traced, and nothing touches the scheduler's requests: the sequences live
beside them in the same pool, so keep them few and free them.
"""
from __future__ import annotations

import torch

from engine.batch import ForwardBatch
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.sequence import ScheduledSeq, Sequence
from engine.tokenizer import IncrementalDetokenizer
from engine.trace.capture import PassCapture


def admit(engine: LLMEngine, ids: list[int], request_id: str = "forward") -> Sequence:
    """A sequence of these token ids in the engine's KV pool (no prefix-cache hits), nothing
    computed yet. Its pages come as it is computed; free them with block_manager.free_seq."""
    seq = Sequence(request_id, list(ids), SamplingParams(), IncrementalDetokenizer.start(engine.tokenizer, ids))
    engine.block_manager.admit(seq, [])
    return seq


def prepare(engine: LLMEngine, seqs: list[Sequence], num_tokens: int | None = None) -> ForwardBatch:
    """The batch of each sequence's next `num_tokens` tokens (None: all it has not computed),
    their KV pages allocated."""
    steps = []
    for seq in seqs:
        n = len(seq) - seq.num_computed_tokens if num_tokens is None else num_tokens
        engine.block_manager.allocate(seq, n)
        steps.append(ScheduledSeq(seq, seq.num_computed_tokens, n))
    return engine.runner.prepare(steps)


def run(engine: LLMEngine, seqs: list[Sequence], num_tokens: int | None = None, *, rows: list[int] | None = None,
        capture: PassCapture | None = None, use_triton: bool | None = None, advance: bool = True) -> torch.Tensor:
    """One pass over each sequence's next `num_tokens` tokens (None: all it has not computed)
    -> the logits at `rows` of the flat batch (None: every row), float32 on the engine's
    device. capture: what a `full` trace would keep (PassCapture); use_triton:
    the kernels' choice for this pass (None: the runner's); advance=False computes the same
    tokens again next time (the same K/V rewritten to the same slots)."""
    batch = prepare(engine, seqs, num_tokens)
    if use_triton is not None:
        batch.use_triton = use_triton
    logits = engine.runner.run(batch, rows, capture)
    if advance:
        for b, seq in enumerate(seqs):
            seq.num_computed_tokens += batch.query_starts[b + 1] - batch.query_starts[b]
    return logits


def prompt_logits(engine: LLMEngine, ids: list[int], chunk: int | None = None) -> torch.Tensor:
    """Logits [len(ids), V] at every position of `ids` (teacher forcing), fed in passes of
    `chunk` tokens (None: one pass), on the CPU (where references are computed); the pages
    are freed again."""
    seq = admit(engine, ids, "teacher-forced")
    out = []
    try:
        while seq.num_computed_tokens < len(ids):
            out.append(run(engine, [seq], min(chunk or len(ids), len(ids) - seq.num_computed_tokens)))
    finally:
        engine.block_manager.free_seq(seq)
    return torch.cat(out).float().cpu()
