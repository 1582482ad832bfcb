"""Tensor parallelism: TP=2 against one device, and the ranks' time in collectives."""
from __future__ import annotations

from benchmarks.bench.context import Bench
from benchmarks.bench.timing import decode_rate, decode_times, greedy, run_engine
from engine.llm_engine import LLMEngine
from engine.trace import EventList, Tracer


def parallel(b: Bench) -> None:
    """Tensor parallelism: 2 ranks (gloo on CPU, NCCL on CUDA) against one device, decode
    rate at batch 1 and s.batch, greedy tokens checked equal; and the share of a traced
    decode step's forward time that each rank spent in its collectives. On a 2-core CPU
    the ranks share the cores the single device had to itself: expect it slower."""
    s = b.settings
    n = s.new_tokens
    one, two = b.engine(), b.engine(tensor_parallel_size=2)
    try:
        for batch in (1, s.batch):
            prompts = b.prompts[:batch]
            toks: dict[str, list[list[int]]] = {}

            def run(key: str, engine: LLMEngine, k: int) -> None:
                outs = run_engine(engine, prompts, [greedy(k)] * batch)
                if k == n:
                    toks[key] = [o["tokens"] for o in outs.values()]
            times = decode_times({"one": lambda k: run("one", one, k), "two": lambda k: run("two", two, k)},
                                 n, s.repeats)
            same = toks["one"] == toks["two"]
            b.add("tensor parallel", f"TP=2 batch {batch} decode tok/s", decode_rate(times, "two", batch * (n - 1)),
                  "tok/s", decode_rate(times, "one", batch * (n - 1)),
                  ("greedy tokens identical" if same else "GREEDY TOKENS DIFFER") + "; baseline: TP=1")
        collective_shares(b, two)
    finally:
        two.shutdown()


def collective_shares(b: Bench, two: LLMEngine) -> None:
    """One traced batch-1 run on the TP=2 engine: each rank's all-reduces over the decode
    steps' forward time."""
    sink = EventList()
    two.tracer, two.default_trace_level = Tracer(sink), "basic"
    run_engine(two, b.prompts[:1], [greedy(b.settings.new_tokens)], trace_level="basic")
    steps = {e.step: e.data for e in sink.events if e.type == "schedule.step"}
    comm = [e for e in sink.events if e.type == "schedule.collective" and steps[e.step]["num_tokens"] == 1]
    forward = sum(steps[e.step]["forward_seconds"] for e in comm) * 1e3
    # the all-reduces inside the forward pass; the batch broadcast is left out: on rank 1
    # it also holds the wait while rank 0 samples and schedules between steps
    for rank in range(2):
        ms = sum(c["ms"][rank] for e in comm for c in e.data["collectives"] if c["layer"] is not None)
        b.add("tensor parallel", f"TP=2 rank {rank}: all-reduces / decode forward", 100 * ms / forward, "%",
              note=f"{ms / len(comm):.2f} ms of {forward / len(comm):.2f} ms per step, "
                   f"{len(comm[0].data['collectives']) - 1} all-reduces per step")
