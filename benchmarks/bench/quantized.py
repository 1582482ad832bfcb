"""Weight-only int8 / int4 decoding on a real checkpoint: speed against transformers
float32, and how far the answers move from the float32 engine's."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Callable

import torch

from benchmarks.bench.agreement import agreement, text_ids
from benchmarks.bench.context import Bench
from benchmarks.bench.real_model import label
from benchmarks.bench.timing import decode_rate, decode_times, greedy, repeat_spread, run_engine
from benchmarks.bench.vs_transformers import hf_reference
from engine.forward import prompt_logits
from engine.llm_engine import LLMEngine


def quantized(b: Bench, name: str = "smollm2", kinds: tuple[str, ...] = ("int8", "int4")) -> None:
    """Weight-only int8 / int4 decoding on a real checkpoint (SmolLM2-135M-Instruct's Q4_1
    GGUF): decode tok/s against transformers float32, the float32 engine in the same
    runs, and how far the answers move from float32's: on a fixed text fed in (teacher
    forcing), the share of positions whose top token is float32's and the mean KL
    divergence of the next-token distributions; free-running, the share of greedy
    tokens equal to float32's, position by position."""
    real = Bench(Path(name), None, b.device, b.settings)
    engines = {"float32": real.engine(), **{k: real.engine(quantization=k) for k in kinds}}
    quantized_speed(b, real, engines, f"{label(name)}: quantized decode")
    quantized_agreement(b, real, engines, kinds, f"{label(name)}: quantized agreement")


def quantized_speed(b: Bench, real: Bench, engines: dict[str, LLMEngine], section: str) -> None:
    """Each engine's decode rate at batch 1 and `batch` against transformers float32."""
    s = b.settings
    ref = hf_reference(engines["float32"].model_path, torch.float32).eval()
    for batch in (1, s.batch):
        prompts = real.prompts[:batch]
        ids = torch.tensor(prompts)

        def hf(n):
            with torch.inference_mode():
                return ref.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0,
                                    attention_mask=torch.ones_like(ids))

        runs = {"transformers": hf, **{k: (lambda n, e=e: run_engine(e, prompts, [greedy(n)] * batch))
                                       for k, e in engines.items()}}
        for fn in runs.values():  # warm-up
            fn(2)
        times = decode_times(runs, s.new_tokens, 2 * s.repeats)
        n = batch * (s.new_tokens - 1)
        for k in engines:
            spread = repeat_spread(times["transformers"], times["transformers1"], times[k], times[k + "1"])
            b.add(section, f"{k} batch {batch} decode tok/s", decode_rate(times, k, n), "tok/s",
                  decode_rate(times, "transformers", n), f"baseline: transformers float32; {spread}")


def quantized_agreement(b: Bench, real: Bench, engines: dict[str, LLMEngine], kinds: tuple[str, ...],
                        section: str) -> None:
    """Teacher-forced top-1 agreement and KL against float32, and free-running greedy tokens."""
    agreement_rows(b, real, engines, kinds, section, lambda e: e.runner.model.quantization.summary())


def agreement_rows(b: Bench, real: Bench, engines: dict[str, LLMEngine], kinds: tuple[str, ...], section: str,
                   describe: Callable[[LLMEngine], str], kl_scale: tuple[float, str] = (1.0, "nats")) -> None:
    """Each of `kinds` against engines["float32"]: teacher-forced top-1 agreement and KL on the
    fixed text, and free-running greedy tokens equal position by position (the quant and
    precision sections). kl_scale: the KL's unit (1e3, "mnats" where it is small)."""
    s = b.settings
    text = text_ids(engines["float32"])
    base_logits = prompt_logits(engines["float32"], text)
    greedy_ref = [o["tokens"] for o in run_engine(engines["float32"], real.prompts[:s.batch],
                                                   [greedy(s.new_tokens)] * s.batch).values()]
    for k in kinds:
        e = engines[k]
        top1, kl = agreement(base_logits, prompt_logits(e, text))
        outs = [o["tokens"] for o in run_engine(e, real.prompts[:s.batch], [greedy(s.new_tokens)] * s.batch).values()]
        same = sum(u == v for x, y in zip(greedy_ref, outs) for u, v in zip(x, y)) / sum(map(len, greedy_ref))
        first = statistics.median(next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), len(x))
                                  for x, y in zip(greedy_ref, outs))
        b.add(section, f"{k}: top-1 = float32's, teacher-forced", 100 * top1, "%", None,
              f"{len(text) - 1} positions of a fixed text; {describe(e)}")
        b.add(section, f"{k}: mean KL(float32 || {k})", kl * kl_scale[0], kl_scale[1], None,
              "next-token distributions, same positions")
        b.add(section, f"{k}: greedy tokens = float32's", 100 * same, "%", None,
              f"{s.batch} prompts x {s.new_tokens} tokens, position by position; median first "
              f"difference at token {first}")
