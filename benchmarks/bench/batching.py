"""Continuous batching against one request after another and against a static batch."""
from __future__ import annotations

from benchmarks.bench.context import Bench
from benchmarks.bench.timing import greedy, median_times, run_engine


def batching(b: Bench) -> None:
    n = b.settings.mixed_requests
    prompts, outs = b.mixed()
    params = [greedy(o) for o in outs]
    useful = sum(outs)
    engine = b.engine(max_num_seqs=n)
    t_cont, t_seq, t_static = median_times([
        lambda: run_engine(engine, prompts, params),
        lambda: [run_engine(engine, [p], [q]) for p, q in zip(prompts, params)],
        # static batching: the whole batch runs until its longest request is done
        lambda: run_engine(engine, prompts, [greedy(max(outs))] * n)], b.settings.repeats)
    b.add("batching", f"{n} mixed requests, continuous: tok/s", useful / t_cont, "tok/s", useful / t_seq,
          "baseline: one after another")
    b.add("batching", f"{n} mixed requests, continuous vs static: tok/s", useful / t_cont, "tok/s",
          useful / t_static, "baseline: static batch padded to the longest output")
