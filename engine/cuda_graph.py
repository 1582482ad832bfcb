"""Decode steps replayed from CUDA graphs.

A decode step of B sequences launches the same kernels with the same shapes every
time; only the values in a few small tensors change (token ids, positions, KV slots,
block tables, context lengths). So, as vLLM and nano-vllm do, the step is recorded
once per batch size into a CUDA graph over static input buffers, and each later step
copies its inputs into those buffers and replays the graph: one launch instead of
hundreds, which at batch 1 on a small model is most of the step's time on a GPU.

A batch of n sequences replays the graph of the smallest captured size >= n; the rows
past n are padding: KV slot -1 (the Triton store kernel skips it) and context length 0
(the Triton attention kernel reads no block for it and outputs zeros), so padding can
neither write into the KV pool nor read from it. The graphs call the Triton kernels
(engine/kernels), which read lengths and block ids on the device; the torch decode path
cuts keys by Python lengths, which a graph would freeze, so graphs need use_triton.
Nothing in the pass may read a tensor's value on the host: a MoE layer, which for one
token reads its chosen expert ids, routes a static batch (`ForwardBatch.static_shapes`)
densely instead, every expert weighted by the router (engine/layers/mlp.py).

Without capture (`capture=False`, any device) the same padded forward runs eagerly over
the same static buffers: that is how the CPU tests check it, and on CUDA it is the
path a capture records. The LM head and the sampler run after the replay, on the rows
of the real sequences.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from engine.batch import ForwardBatch
from engine.config import EngineConfig
from engine.config import ProgressFn
from engine.trace.capture import PassCapture

DEFAULT_MAX_CAPTURE = 32  # start-up stays quick: at most 1, 2, 4, 8, 16, 32 captured by default


def capture_sizes(max_num_seqs: int, sizes: list[int] | tuple[int, ...] | None = None,
                  limit: int = DEFAULT_MAX_CAPTURE) -> list[int]:
    """Batch sizes to capture, ascending. Given `sizes`: those that fit max_num_seqs. Else
    nano-vllm's 1, 2, 4, 8, then every 16, up to min(max_num_seqs, limit), with that largest
    batch itself added where it falls between two (max_num_seqs=12: 1, 2, 4, 8, 12)."""
    top = max_num_seqs if sizes is not None else min(max_num_seqs, limit)
    if sizes is None:
        sizes = [1, 2, 4, 8] + list(range(16, top + 1, 16))
        sizes.append(top)
    if any(s < 1 for s in sizes):
        raise ValueError(f"CUDA graph batch sizes must be >= 1, got {sorted(sizes)}")
    return sorted({s for s in sizes if s <= top})


def padded_size(sizes: list[int], n: int) -> int | None:
    """The smallest captured size that holds n sequences (None: above the largest)."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


def graphs_wanted(ecfg: EngineConfig, device: torch.device, use_triton: bool) -> bool:
    """Whether a runner captures decode graphs: cuda_graphs=None turns them on where they
    can run (CUDA with the Triton kernels); True insists (an error where they cannot)."""
    if ecfg.cuda_graphs is False:
        return False
    why = None if device.type == "cuda" else f"a CUDA device (this one is {device.type})"
    why = why or (None if use_triton else "the Triton kernels (use_triton)")
    if why is not None and ecfg.cuda_graphs:
        raise ValueError(f"cuda_graphs=True needs {why}")
    return why is None


class DeviceOnly(list):
    """The Python context lengths of a static batch: a graph replays other lengths than the
    capture saw, so a layer that read these would be wrong silently; it fails instead."""

    def __getitem__(self, i):
        raise RuntimeError("a static (CUDA graph) batch has its context lengths on the device only")

    def __iter__(self):
        raise RuntimeError("a static (CUDA graph) batch has its context lengths on the device only")


@dataclass
class StaticInputs:
    """The buffers every graph reads: sized for the largest batch, padding by default."""
    input_ids: torch.Tensor  # [max] long
    positions: torch.Tensor  # [max] long
    slot_mapping: torch.Tensor  # [max] long, -1 = padding (not stored)
    block_tables: torch.Tensor  # [max, max_blocks_per_seq] long
    context_lens: torch.Tensor  # [max] int32, 0 = padding (nothing attended)
    hidden: torch.Tensor  # [max, hidden] the final hidden states the LM head reads

    @classmethod
    def allocate(cls, rows: int, max_blocks: int, hidden_size: int, dtype: torch.dtype,
                 device: torch.device) -> "StaticInputs":
        long = dict(dtype=torch.long, device=device)
        return cls(torch.zeros(rows, **long), torch.zeros(rows, **long), torch.full((rows,), -1, **long),
                   torch.zeros(rows, max_blocks, **long), torch.zeros(rows, dtype=torch.int32, device=device),
                   torch.zeros(rows, hidden_size, dtype=dtype, device=device))

    def batch(self, size: int) -> ForwardBatch:
        """A decode batch of `size` rows over views of the buffers (what a graph records).
        Its lengths exist on the device only: the Python list can be counted, not read."""
        return ForwardBatch(
            input_ids=self.input_ids[:size], positions=self.positions[:size],
            slot_mapping=self.slot_mapping[:size], query_starts=list(range(size + 1)),
            context_lens=DeviceOnly([0] * size), block_tables=self.block_tables[:size],
            context_lens_t=self.context_lens[:size], use_triton=True, static_shapes=True)


class DecodeGraphs:
    """Padded decode steps over static buffers, replayed from CUDA graphs (`capture=True`,
    CUDA only) or run eagerly over the same buffers (`capture=False`)."""

    def __init__(self, model: torch.nn.Module, sizes: list[int], max_blocks_per_seq: int,
                 hidden_size: int, dtype: torch.dtype, device: torch.device, capture: bool) -> None:
        if not sizes:
            raise ValueError("no batch sizes to capture")
        if capture and device.type != "cuda":
            raise ValueError(f"CUDA graphs are captured on a CUDA device, not {device.type}")
        self.model, self.sizes, self.device, self.capture = model, sorted(sizes), device, capture
        with torch.inference_mode():
            self.static = StaticInputs.allocate(self.sizes[-1], max_blocks_per_seq, hidden_size, dtype, device)
        self.batches = {s: self.static.batch(s) for s in self.sizes}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.replays = 0  # steps served here (graph or padded eager), for tests and the bench

    @classmethod
    def for_runner(cls, runner, sizes: list[int], capture: bool) -> "DecodeGraphs":
        """Buffers shaped for a ModelRunner's model, pool and longest sequence."""
        if not runner.use_triton:
            raise ValueError("decode graphs run the Triton kernels: the runner needs use_triton")
        max_blocks = -(-runner.max_model_len // runner.block_size)
        return cls(runner.model, sizes, max_blocks, runner.cfg.hidden_size, runner.dtype, runner.device, capture)

    def eager_reason(self, batch: ForwardBatch, capture: PassCapture | None = None) -> str | None:
        """Why this step must run the ordinary eager pass (None: it can be replayed)."""
        if not batch.decode_only:
            return "prefill or mixed step"
        if capture is not None:
            return "full trace: tensors read during the pass"
        if batch.num_seqs > self.sizes[-1]:
            return f"batch {batch.num_seqs} above the largest captured size {self.sizes[-1]}"
        if batch.block_tables.shape[1] > self.static.block_tables.shape[1]:
            return "block table wider than the captured one"
        return None

    @torch.inference_mode()
    def capture_all(self, progress: ProgressFn | None = None) -> None:
        """Record one graph per size, largest first so the smaller ones reuse its memory pool.
        Each size runs once eagerly before its capture (Triton compiles its kernels then)."""
        assert self.capture
        pool = None
        bar = tqdm(total=len(self.sizes), desc="Capturing CUDA graphs", unit="batch size",
                   disable=progress is not None)
        with bar:
            for i, size in enumerate(reversed(self.sizes)):
                self._forward(size)
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._forward(size)
                pool = graph.pool() if pool is None else pool
                self.graphs[size] = graph
                bar.update(1)
                if progress is not None:
                    progress(i + 1, len(self.sizes), "CUDA graphs")
        torch.cuda.synchronize(self.device)

    def _forward(self, size: int) -> None:
        self.static.hidden[:size].copy_(self.model(self.batches[size]))

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Final hidden states [n, hidden] of a decode batch of n sequences, through the
        padded static path. A view of the static buffer: valid until the next step."""
        n = batch.num_seqs
        size = padded_size(self.sizes, n)
        s, width = self.static, batch.block_tables.shape[1]
        s.input_ids[:n].copy_(batch.input_ids)
        s.positions[:n].copy_(batch.positions)
        s.slot_mapping[:n].copy_(batch.slot_mapping)
        s.slot_mapping[n:size].fill_(-1)  # padding: the store kernel skips these rows
        s.context_lens[:n].copy_(batch.context_lens_t)
        s.context_lens[n:size].zero_()  # padding: no key read
        s.block_tables[:n, :width].copy_(batch.block_tables)  # columns past a row's context are never read
        if self.capture:
            self.graphs[size].replay()
        else:
            self._forward(size)
        self.replays += 1
        return s.hidden[:n]
