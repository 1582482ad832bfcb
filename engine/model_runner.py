"""Owns the model and the KV pool on the device; turns a scheduled batch into
tensors, runs the forward pass and returns the logits that are sampled."""
from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import torch

from engine.batch import ForwardBatch
from engine.checkpoint.weights import load_model
from engine.config import EngineConfig, ModelConfig, ProgressFn
from engine.cuda_graph import DecodeGraphs, capture_sizes, graphs_wanted
from engine.kernels import cpu as cpu_kernels
from engine.kernels import triton_available
from engine.sequence import ScheduledSeq
from engine.trace import logit_lens
from engine.trace.capture import PassCapture, collect


def kv_pool_blocks(cfg: ModelConfig, ecfg: EngineConfig, max_model_len: int, dtype: torch.dtype,
                   device: torch.device) -> int:
    """How many blocks the pool gets: explicit count, memory fraction, or a default."""
    bytes_per_block = cfg.kv_bytes_per_token * ecfg.block_size * dtype.itemsize
    if ecfg.num_kv_blocks is not None:
        return ecfg.num_kv_blocks
    if ecfg.kv_cache_memory_fraction is not None:
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
        else:
            free = _available_host_memory()
        return max(1, int(free * ecfg.kv_cache_memory_fraction) // bytes_per_block)
    wanted = ecfg.max_num_seqs * -(-max_model_len // ecfg.block_size)
    return max(1, min(wanted, ecfg.kv_cache_max_bytes // bytes_per_block))


def _available_host_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _every_row(rows: list[int], n: int) -> bool:
    """rows is 0..n-1 in order (a decode step samples every row): no copy needed."""
    return len(rows) == n and (n == 0 or (rows[0] == 0 and rows[-1] == n - 1 and rows == list(range(n))))


class ModelRunner:
    """One device's runner. A sharded one (engine/parallel) has the same interface: its
    `placement` of layers and heads on ranks, and the collectives of its last traced step."""
    placement = None  # one device: nothing is placed on other ranks
    decode_graphs: DecodeGraphs | None = None  # CUDA graphs of the decode step, where captured

    def __init__(self, path: Path, cfg: ModelConfig, ecfg: EngineConfig, max_model_len: int,
                 dtype: torch.dtype, device: torch.device, progress: ProgressFn | None = None) -> None:
        self.cfg, self.ecfg = cfg, ecfg
        # CPU bfloat16 / float16: weights kept in 16 bits by the C kernels, the pass in float32
        self.weight_dtype, dtype = dtype, cpu_kernels.compute_dtype(dtype, device)
        self.device, self.dtype = device, dtype
        if ecfg.quantization is not None and device.type != "cpu":
            raise ValueError(f"quantization={ecfg.quantization!r} runs on the CPU only (PyTorch's CPU "
                             f"weight-only kernels); device is {device.type}")
        self.model = load_model(path, cfg, max_model_len, dtype, device, progress, ecfg.quantization,
                                weight_dtype=self.weight_dtype if self.weight_dtype != dtype else None)
        self.num_blocks = kv_pool_blocks(cfg, ecfg, max_model_len, dtype, device)
        self.block_size = ecfg.block_size
        # One preallocated pool: [K/V, layer, block, slot, kv head, head dim]; MLA keeps one
        # latent instead: [1, layer, block, slot, 1, kv_lora_rank + qk_rope_head_dim]
        kinds, heads, dims = cfg.kv_layout
        shape = (kinds, cfg.num_layers, self.num_blocks, ecfg.block_size, heads, dims)
        if device.type == "cpu":  # on 2 MB pages: a decode step reads pages scattered over the pool
            self.kv_cache = cpu_kernels.huge_page_zeros(shape, dtype)
        else:
            self.kv_cache = torch.zeros(shape, dtype=dtype, device=device)
        for i, attn in enumerate(self.model.attention_layers()):
            attn.k_cache, attn.v_cache = self.kv_cache[0, i], self.kv_cache[-1, i]  # MLA: both the latent
        use_triton = ecfg.use_triton
        if use_triton is None:
            use_triton = device.type == "cuda" and triton_available()
        if cfg.mla is not None and ecfg.cuda_graphs:  # MLA's decode (engine/layers/mla.py) is not captured yet
            raise ValueError("cuda_graphs=True on an MLA model (DeepSeek): its decode step is not captured in "
                             "CUDA graphs yet; leave cuda_graphs unset")
        self.use_triton = use_triton
        self.max_model_len = max_model_len
        # CUDA graphs of the decode step (DecodeGraphs), captured now: part of start-up
        if graphs_wanted(ecfg, device, use_triton) and cfg.mla is None:
            self.model.model.cover_positions(max_model_len)  # a graph reads the RoPE tables it was captured with
            sizes = capture_sizes(ecfg.max_num_seqs, ecfg.cuda_graph_sizes)
            self.decode_graphs = DecodeGraphs.for_runner(self, sizes, capture=True)
            self.decode_graphs.capture_all(progress)

    @property
    def kv_cache_bytes(self) -> int:
        return self.kv_cache.numel() * self.kv_cache.element_size()

    def prepare(self, scheduled: list[ScheduledSeq]) -> ForwardBatch:
        ids, positions, slots, starts, ctx = [], [], [], [0], []
        bs = self.block_size
        for s in scheduled:
            seq = s.seq
            end = s.start + s.num_tokens
            ids.extend(s.token_ids())
            positions.extend(range(s.start, end))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(s.start, end))
            starts.append(starts[-1] + s.num_tokens)
            ctx.append(end)
        width = max(len(s.seq.block_table) for s in scheduled)
        tables = [s.seq.block_table + [0] * (width - len(s.seq.block_table)) for s in scheduled]
        dev = self.device
        return ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.long, device=dev),
            positions=torch.tensor(positions, dtype=torch.long, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            query_starts=starts,
            context_lens=ctx,
            block_tables=torch.tensor(tables, dtype=torch.long, device=dev),
            context_lens_t=torch.tensor(ctx, dtype=torch.int32, device=dev),
            use_triton=self.use_triton,
        )

    @torch.inference_mode()
    def run(self, batch: ForwardBatch, token_rows: list[int] | None = None,
            capture: PassCapture | None = None) -> torch.Tensor:
        """Write the batch's K/V into the cache and return the logits [len(token_rows), V]
        at those tokens of the flattened batch (every token if None). Only rows that
        are sampled or verified need the LM head. A traced pass fills `capture`."""
        graphs = self.decode_graphs
        if graphs is not None and graphs.eager_reason(batch, capture) is None:  # a replay: plain decode steps only
            hidden = graphs.forward(batch)
        else:
            hidden = self.model(batch, capture)
        if capture is not None:
            if capture.pending:  # (the one-call stack left its bookkeeping for when the captures are read)
                capture.pending.append(partial(collect, capture, batch, self.cfg, self.kv_cache))
            else:
                collect(capture, batch, self.cfg, self.kv_cache)
        if token_rows is not None and not _every_row(token_rows, hidden.shape[0]):
            hidden = hidden[token_rows]
        return logit_lens.logits_with_lens(self.model, hidden, capture)  # the lens's rows too, if any

    def trace_events(self) -> list[dict]:
        """What crossed between ranks in the last traced step: nothing on one device."""
        return []

    def shutdown(self) -> None:
        """Nothing to stop on one device (a sharded runner stops its worker ranks)."""
