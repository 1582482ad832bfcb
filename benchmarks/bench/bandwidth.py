"""Batch-1 decode as memory traffic against the measured copy bandwidth; on the CPU the
C kernel's linears against oneDNN; on CUDA the decode steps with CUDA graphs and without."""
from __future__ import annotations

import torch

from benchmarks.bench.context import Bench
from benchmarks.bench.timing import decode_seconds, greedy, median_time, median_times, run_engine, synchronize
from engine.kernels import cpu as cpu_kernels
from engine.layers.linear import Linear, pack_weight, packed_linear
from engine.llm_engine import LLMEngine


def decode_bytes_per_token(model: torch.nn.Module, cfg, context_tokens: int) -> int:
    """Bytes a batch-1 decode step must read from memory: every weight it uses (MoE:
    only the routed top-k of each layer's experts; the embedding table: one row, unless
    the LM head shares it) plus the K/V of `context_tokens` earlier tokens. Where the CPU's C
    kernels run, a weight's only copy is its blocked one (padding included: it is read too)."""
    weights = 0
    for m in model.modules():
        if isinstance(m, Linear) and m.blocked is not None:
            weights += m.blocked.nbytes
        elif getattr(m, "c_experts", None) is not None:  # a MoE block's experts (engine/layers/moe_cpu.py)
            weights += sum(w.nbytes for w in m.c_experts.blocked_weights()) * cfg.num_experts_per_tok // cfg.num_experts
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
    attn = next(layer.self_attn for layer in model.model.layers)
    kv = cfg.kv_bytes_per_token * attn.k_cache.element_size() * context_tokens
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


def bandwidth_bound(b: Bench, copy_bytes: int = 1 << 28) -> None:
    """Batch-1 decode as memory traffic (any device): the bytes one step must read
    (weights, and the KV of the context) times tok/s, against the machine's measured
    copy bandwidth, so the gap to the limit is one number. On a model small enough to
    stay in the CPU's cache (the embedded one) the ratio can pass 1. On CUDA: the HBM
    roofline fraction with the decode steps replayed from CUDA graphs and without
    (engine/cuda_graph.py), and the graphs' decode speed against eager."""
    s = b.settings
    engines = {"": b.engine()} if not b.cuda else {
        "CUDA graphs": b.engine(cuda_graphs=True), "eager": b.engine(cuda_graphs=False)}
    prompts = b.prompts[:1]
    for engine in engines.values():
        run_engine(engine, prompts, [greedy(2)])  # warm-up: CUDA context, Triton compilation
    times = median_times([lambda e=e: decode_seconds(e, prompts, [greedy(s.new_tokens)])
                          for e in engines.values()], s.repeats)
    rates = {k: (s.new_tokens - 1) / t for k, t in zip(engines, times)}
    engine = next(iter(engines.values()))
    context = s.prompt_tokens + s.new_tokens // 2
    read = decode_bytes_per_token(engine.runner.model, engine.model_config, context)
    kv = read - decode_bytes_per_token(engine.runner.model, engine.model_config, 0)
    threads = torch.get_num_threads()
    bandwidth = measured_bandwidth(b.device, copy_bytes)
    note = ""
    if b.device == "cpu":  # one thread, too: on a CPU one core may reach most of it
        single = measured_bandwidth(b.device, copy_bytes, threads=1)
        note = f"; copy: {bandwidth / 1e9:.3g} GB/s on {threads} threads, {single / 1e9:.3g} GB/s on 1"
        bandwidth = max(bandwidth, single)
    if b.cuda and engine.model_config.is_moe:  # a replayed step routes densely: no expert ids on the host
        note += "; CUDA graphs: every expert read at batch 1, counted here as top-k"
    for kind, rate in rates.items():
        name = f"batch-1 decode{f', {kind}' if kind else ''}: weights + KV read, GB/s"
        b.add("bandwidth", name, rate * read / 1e9, "GB/s", bandwidth / 1e9,
              f"baseline: measured copy{' (HBM)' if b.cuda else ''}; {rate:.1f} tok/s x {read / 2**20:.1f} MiB "
              f"read per token ({kv / 2**20:.2f} MiB of it KV, {context} tokens); "
              f"bound {bandwidth / read:.1f} tok/s{note}")
    if b.device == "cpu":
        cpu_linears(b, engine, bandwidth)
    if b.cuda:
        graphs = engines["CUDA graphs"].runner.decode_graphs
        b.add("bandwidth", "batch-1 decode tok/s, CUDA graphs vs eager", rates["CUDA graphs"], "tok/s",
              rates["eager"], f"baseline: eager; captured batch sizes {graphs.sizes}, "
              f"{graphs.replays} steps replayed")


@torch.inference_mode()
def cpu_linears(b: Bench, engine: LLMEngine, bandwidth: float) -> None:
    """CPU: the model's linear layers alone, at 1 and `batch` rows, through the C kernel
    (engine/kernels/cpu_linear.c) against oneDNN on the same weights (reordered for it
    here): the weights' bytes over the time, so each one's share of the memory
    bandwidth is one number."""
    layers = [m for m in engine.runner.model.modules() if isinstance(m, Linear) and m.blocked is not None]
    if not layers:
        return
    # the blocked copy is each layer's only one: oneDNN's is made from it, read back
    packed = [pack_weight(m.blocked.unblocked().float(), min_bytes=0) for m in layers]
    nbytes = sum(m.blocked.nbytes for m in layers)
    for rows in (1, b.settings.batch):
        xs = [torch.randn(rows, m.in_features) for m in layers]
        t_ours, t_onednn = median_times([
            lambda: [cpu_kernels.linear(x, m.blocked, m.bias) for m, x in zip(layers, xs)],
            lambda: [packed_linear(x, p, m.bias) for m, p, x in zip(layers, packed, xs)]], max(b.settings.repeats, 5))
        b.add("bandwidth", f"linear layers alone, {rows} row{'s' if rows > 1 else ''}: C kernel vs oneDNN, GB/s",
              nbytes / t_ours / 1e9, "GB/s", nbytes / t_onednn / 1e9,
              f"baseline: oneDNN on the same weights; {len(layers)} layers, {nbytes / 2**20:.0f} MiB; "
              f"the C kernel at {nbytes / t_ours / bandwidth:.2f} of the measured copy bandwidth")
