"""Linear layers with the CPU's fast paths for float32 weights.

A decode step reads every weight once, so on a CPU its speed is how fast the matmuls
stream weights from memory. PyTorch's default float32 matmul (MKL's sgemm) streams
them well below the memory bandwidth, and at a few rows (a decode batch of 2-16
sequences) far below it. Two faster paths, each reading a copy of the weight reordered
once into a blocked layout:

- this project's C kernel (engine/kernels/cpu_linear.c), where it builds: at one row it
  streams SmolLM2's matrices at about the machine's read bandwidth, well above oneDNN
  (benchmarks/bench/bandwidth.py measures both). Used up to kernels.cpu.kernel_rows(dtype) rows
  (MAX_ROWS on an AVX2 build; a short prefill chunk too on an AVX-512 one, every prefill at
  bfloat16); a larger one is a compute-bound GEMM, left to PyTorch's sgemm.
- otherwise oneDNN's kernels: faster than MKL's at one row, more so at eight. Their
  fixed cost per call outweighs that for
  small matrices, which sit in the cache anyway, so only weights of at least
  PACK_MIN_BYTES are reordered.

Loading fills the plain parameter; `pack` then moves it into the C kernel's layout, which
is from then on the layer's only copy of it (the parameter freed; an embedding tied to the
LM head reads its rows from the same copy, see Embedding). The copy may be stored in
16 bits (`--dtype bfloat16` / `float16` on the CPU: half the bytes to stream, the sums
still float32; at bfloat16 x is rounded to bfloat16 too, as a bfloat16 matmul does). Over
kernel_rows rows (a long prefill chunk) the layer widens the copy back for PyTorch's GEMM
(prefill_gemm; bfloat16 on AMX tiles where the CPU has them). oneDNN's copy, where the C kernel
does not build, still sits beside the parameter.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels import cpu as cpu_kernels
from engine.layers import prefill_gemm

if TYPE_CHECKING:
    from engine.layers.quantized import QuantizedWeight

PACK_MIN_BYTES = 1 << 20
PACK_ROWS = 16  # the row count oneDNN tunes the layout for; it serves 1 to hundreds of rows well


def pack_weight(w: torch.Tensor, min_bytes: int | None = None) -> torch.Tensor | None:
    """w [out, in] reordered for oneDNN's matmul, or None where that does not pay: off the
    CPU, other dtypes, or under `min_bytes` (default PACK_MIN_BYTES)."""
    min_bytes = PACK_MIN_BYTES if min_bytes is None else min_bytes
    if w.device.type != "cpu" or w.dtype != torch.float32 or not torch.backends.mkldnn.is_available() \
            or w.numel() * w.element_size() < min_bytes:
        return None
    return torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, in] @ W.T (+ bias) with W from pack_weight."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


_generation = [0]  # bumped whenever a layer's weight copy is made, replaced or dropped


def weights_changed() -> None:
    """A weight copy changed (pack, unpack, quantize): plans that point into copies
    (engine/layers/fused.py) are rebuilt."""
    _generation[0] += 1


def generation() -> int:
    return _generation[0]


class Linear(nn.Linear):
    blocked: cpu_kernels.BlockedWeight | None = None  # the weight in the C kernel's layout, once `pack`ed
    packed: torch.Tensor | None = None  # the weight in oneDNN's layout, once `pack`ed (no C kernel)
    qweight: "QuantizedWeight | None" = None  # int8/int4 codes, once `quantize`d (engine/checkpoint/quantize.py)

    def pack(self, on: bool = True, dtype: torch.dtype | None = None) -> None:
        """on: the weight into the C kernel's layout (stored as `dtype`, default its own), then
        its only copy; or, without the kernel, a oneDNN copy beside it. off: the parameter back."""
        if not on:
            self.unpack()
            return
        if self.qweight is not None or self._parameters.get("weight") is None:
            return
        weights_changed()
        self.blocked = cpu_kernels.blocked_weight(self.weight, dtype)
        if self.blocked is not None:
            self.weight = None  # freed, unless another module holds it (a tied embedding: see pack_weights)
        self.packed = pack_weight(self.weight) if self.blocked is None else None

    def __getattr__(self, name: str):
        # `weight` where the blocked copy is the only one: read back (a fresh float32 tensor) for
        # code that reads the matrix itself (MLA's per-head up-projections); the layer's own
        # passes never take this path
        value = super().__getattr__(name)
        if value is None and name == "weight" and self.__dict__.get("blocked") is not None:
            return self.blocked.unblocked().float()
        return value

    def unpack(self) -> None:
        """The plain float32 parameter again, read back from the blocked copy (PyTorch's matmul)."""
        if self.blocked is not None:
            self.weight = nn.Parameter(self.blocked.unblocked().float(), requires_grad=False)
        self.blocked = self.packed = None
        weights_changed()

    def quantize(self, qw: "QuantizedWeight", drop_float: bool) -> None:
        """Run on the packed codes from now on. drop_float: free the float weight (not when
        another module shares it, as a tied LM head shares the embedding)."""
        self.qweight, self.packed, self.blocked = qw, None, None
        weights_changed()
        # buffers, so the module's byte counts (bench, page) see the codes and scales
        self.register_buffer("qdata", qw.data, persistent=False)
        self.register_buffer("qscales", qw.scales, persistent=False)
        if drop_float:
            self.weight = None

    def forward(self, x: torch.Tensor, exact_rows: int = 0) -> torch.Tensor:
        """exact_rows: on a bfloat16 blocked copy, the first rows of x [T, in] not rounded to
        bfloat16 (the logit lens's, beside the model's own rows: engine/trace/logit_lens.py)."""
        if self.qweight is not None:
            return self.qweight.linear(x, self.bias)
        if self.blocked is not None:
            if x.numel() <= cpu_kernels.kernel_rows(self.blocked.dtype) * x.shape[-1]:
                return cpu_kernels.linear(x, self.blocked, self.bias, exact_rows=exact_rows)
            return prefill_gemm.gemm(x, self.blocked, self.bias, exact_rows)
        if self.packed is not None:
            return packed_linear(x, self.packed, self.bias)
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Embedding):
    """nn.Embedding that can read its rows from a tied LM head's blocked copy (`tied`), where
    that copy is the only one, and widen 16-bit rows to the float32 the pass computes in."""
    tied: Linear | None = None  # set through __dict__: not a submodule of its own (the head is the model's)
    widen = False  # a 16-bit table of its own: rows widened to float32 on lookup

    def reset_parameters(self) -> None:
        # built on the meta device, then loaded (checkpoint/weights.py build_model): a random init
        # there is no memory, but its normal_ on meta runs through torch._dynamo, whose import maps
        # triton's library (66 MB of code pages) into every CPU process
        if self.weight.device.type != "meta":
            super().reset_parameters()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tied is not None:
            return self.tied.blocked.rows(ids)
        out = super().forward(ids)
        return out.float() if self.widen else out

    def pack(self, on: bool = True, dtype: torch.dtype | None = None) -> None:
        """Untied: its table stored as `dtype` (the 16-bit weights' memory), rows widened on
        lookup. Tied: see pack_weights."""
        if not on:
            if self.tied is not None:
                self.weight = self.tied.weight
            self.__dict__["tied"] = None
            return
        if self.tied is None and self.weight is not None and self.weight.device.type == "cpu" \
                and dtype in (torch.bfloat16, torch.float16):
            self.weight = nn.Parameter(self.weight.detach().to(dtype), requires_grad=False)
            self.widen = True


def pack_weights(model: nn.Module, on: bool = True, dtype: torch.dtype | None = None) -> None:
    """Reorder the float CPU weights for the C kernel, stored as `dtype` (default their own),
    which then is each weight's only copy (or, without the kernel, the large ones for oneDNN,
    beside the parameters), in every module that can (after the weights are loaded: the copies
    do not follow later changes to the parameters). An embedding tied to a blocked LM head
    then reads its rows from the head's copy. on=False: back to PyTorch's default matmul on
    float32 parameters read back from the copies."""
    embeddings = [m for m in model.modules() if isinstance(m, Embedding)]
    owners = {id(e.weight): e for e in embeddings if e.weight is not None}
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    tied = {id(m): owners.get(id(m.weight)) for m in linears if m.weight is not None}
    for m in model.modules():
        if hasattr(m, "pack") and not isinstance(m, Embedding):
            m.pack(on, dtype)
    for m in linears:
        e = tied.get(id(m))
        if on and e is not None and m.blocked is not None:
            e.__dict__["tied"], e.weight = m, None  # the head's blocked copy is the only one
    for e in embeddings:
        e.pack(on, dtype)
    for m in linears:  # a quantized head that kept the float table for its embedding, which now has its own
        e = tied.get(id(m))
        if on and e is not None and m.qweight is not None and e.widen:
            m.weight = None
