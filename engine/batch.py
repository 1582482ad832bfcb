"""What one forward pass needs: the flattened tokens of every scheduled sequence and
where their K/V go in the paged cache (like nano-vllm's Context). What a traced pass
records is an object of its own, handed to the model beside the batch
(engine/trace/capture.py's PassCapture)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] tokens of all sequences, concatenated
    positions: torch.Tensor  # [T] absolute positions
    slot_mapping: torch.Tensor  # [T] where each token's K/V is stored
    query_starts: list[int]  # len B+1: sequence b owns tokens [starts[b], starts[b+1])
    context_lens: list[int]  # keys visible to sequence b after this pass (cached + new)
    block_tables: torch.Tensor  # [B, max_blocks] int64, padded with 0
    context_lens_t: torch.Tensor  # [B] int32, same as context_lens
    use_triton: bool = False
    # a padded decode batch that a CUDA graph replays (engine/cuda_graph.py): no layer may
    # read a tensor's values on the host (the graph would keep the values seen at capture)
    static_shapes: bool = False
    # set by the model: RoPE table ("global", or Gemma's "local") -> cos, sin at `positions`
    rope: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens)

    @property
    def decode_only(self) -> bool:
        return self.query_starts[-1] == self.num_seqs

    def seq_slice(self, b: int) -> slice:
        return slice(self.query_starts[b], self.query_starts[b + 1])

    @functools.cached_property
    def row_keys(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token row as a query of its own (the fused CPU layers, engine/layers/fused.py):
        its sequence's block table [T, max_blocks] and how many keys it sees [T] int32, its
        position + 1 (the pass's K/V are all stored before anyone attends). For a decode-only
        pass these are the batch's own tables and lengths."""
        if self.decode_only:
            return self.block_tables, self.context_lens_t
        counts = torch.tensor([self.query_starts[b + 1] - self.query_starts[b] for b in range(self.num_seqs)],
                              device=self.block_tables.device)
        rows = torch.repeat_interleave(torch.arange(self.num_seqs, device=counts.device), counts)
        return self.block_tables.index_select(0, rows), (self.positions + 1).to(torch.int32)

    @functools.cached_property
    def decode_group(self) -> "DecodeGroup | None":
        """Sequences with one query token this pass: attended to together, padded."""
        seqs = [b for b in range(self.num_seqs) if self.query_starts[b + 1] - self.query_starts[b] == 1]
        if not seqs:
            return None
        lens = [self.context_lens[b] for b in seqs]
        if len(seqs) == self.num_seqs:
            return DecodeGroup(seqs, None, self.block_tables, self.context_lens_t, lens)
        dev = self.input_ids.device
        idx = torch.tensor(seqs, device=dev)
        rows = torch.tensor([self.query_starts[b] for b in seqs], device=dev)
        return DecodeGroup(seqs, rows, self.block_tables[idx], self.context_lens_t[idx], lens)


@dataclass
class DecodeGroup:
    seqs: list[int]  # batch indices
    rows: torch.Tensor | None  # their token rows in the batch (None: every row)
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    lens: list[int]  # context_lens as Python ints
    _masks: dict[tuple[int | None, torch.dtype | None], torch.Tensor | None] = field(default_factory=dict)

    def key_mask(self, window: int | None, num_keys: int, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        """Which of the `num_keys` gathered keys each query sees ([B, num_keys]), built once
        per pass for all the layers with this window; None when no mask is needed: one
        sequence, no window cutting in, and its keys cut to its context (`lens`).
        dtype: as an additive bias of that dtype instead (0 seen, -inf hidden), which SDPA
        would otherwise rebuild from the bool mask in every layer."""
        if (window, dtype) not in self._masks:
            single = len(self.lens) == 1 and (window is None or self.lens[0] <= window)
            mask = None if single else key_mask(self.context_lens, num_keys, window)
            if mask is not None and dtype is not None:
                mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
            self._masks[window, dtype] = mask
        return self._masks[window, dtype]


def key_mask(context_lens: torch.Tensor, num_keys: int, window: int | None) -> torch.Tensor:
    """[B, num_keys] bool: key j is visible to the query at position context_lens[b] - 1."""
    k_pos = torch.arange(num_keys, device=context_lens.device)[None, :]
    q_pos = (context_lens.long() - 1)[:, None]
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= k_pos > q_pos - window
    return allowed
