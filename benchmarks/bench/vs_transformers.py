"""The engine against transformers' `generate` on the same checkpoint: decode rate at
batch 1 and `settings.batch`, greedy tokens checked equal."""
from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.bench.context import Bench
from benchmarks.bench.timing import decode_rate, decode_times, greedy, repeat_spread, run_engine


def hf_reference(path: Path, dtype: torch.dtype) -> torch.nn.Module:
    """transformers' own model on the same checkpoint (a GGUF file through `gguf_file=`)."""
    from transformers import AutoModelForCausalLM  # lazy: a heavy import, only for the sections that use it
    if path.suffix == ".gguf":
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)


def vs_transformers(b: Bench) -> None:
    s = b.settings
    engine = b.engine()
    ref = hf_reference(engine.model_path, engine.dtype).to(b.device).eval()
    for batch in (1, s.batch):
        prompts = b.prompts[:batch]
        ids = torch.tensor(prompts, device=b.device)

        def hf(n):
            with torch.inference_mode():
                return ref.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None,
                                    pad_token_id=0, attention_mask=torch.ones_like(ids))[:, ids.shape[1]:].tolist()

        def ours(n):
            outs = run_engine(engine, prompts, [greedy(n)] * batch)
            return [o["tokens"] for o in outs.values()]
        same = hf(s.new_tokens) == ours(s.new_tokens)
        # decode rate: tokens after the first, so prefill is left out of both
        times = decode_times({"hf": hf, "us": ours}, s.new_tokens, 2 * s.repeats)
        n = batch * (s.new_tokens - 1)
        spread = repeat_spread(times["hf"], times["hf1"], times["us"], times["us1"])
        b.add("decode vs transformers", f"batch {batch} decode tok/s", decode_rate(times, "us", n), "tok/s",
              decode_rate(times, "hf", n),
              ("greedy tokens identical" if same else "GREEDY TOKENS DIFFER") + f"; {spread}")
