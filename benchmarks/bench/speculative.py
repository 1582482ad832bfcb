"""Speculative decoding (k=4) with the draft model against the same engine without it."""
from __future__ import annotations

from benchmarks.bench.context import Bench
from benchmarks.bench.timing import greedy, median_times, run_engine
from engine.llm_engine import LLMEngine


def speculative(b: Bench) -> None:
    if b.draft is None:
        return
    s = b.settings
    spec = LLMEngine(b.model, device=b.device, draft=b.draft, num_speculative_tokens=4)
    prompts, params = b.prompts[:1], [greedy(s.new_tokens)]
    counts = {"passes": 0, "tokens": 0, "accepted": 0, "proposed": 0}

    def with_speculation():  # counts only these runs' passes and proposals
        st = spec.stats
        before = st.target_passes, st.generated_tokens, st.spec_accepted, st.spec_proposed
        run_engine(spec, prompts, params)
        for key, after, then in zip(counts, (st.target_passes, st.generated_tokens, st.spec_accepted,
                                             st.spec_proposed), before):
            counts[key] += after - then
    t_off, t_on = median_times([lambda: run_engine(spec, prompts, params, speculative=False),
                                with_speculation], s.repeats)
    passes, tokens, acc, prop = counts.values()
    b.add("speculative (k=4)", "tok/s with vs without", s.new_tokens / t_on, "tok/s", s.new_tokens / t_off)
    b.add("speculative (k=4)", "target passes per token", passes / tokens, "passes", 1.0,
          "baseline: one pass per token")
    b.add("speculative (k=4)", "acceptance rate", acc / max(prop, 1), "", None, f"{acc}/{prop} proposals")
