"""The CPU's own kernels (cpu_linear.c, cpu_attention.c, cpu_norm.c, cpu_layer.c, cpu_stats.c, sharing
cpu_vec.h; the quantized ones,
cpu_quant.c, load through cpu_quant.py): compiled on first use with the system's C
compiler for this machine's CPU, cached, and called through ctypes.

Why C and not PyTorch: a decode step is a few rows times every weight, bound by how fast
the weights stream from memory, and PyTorch's CPU matmuls (MKL, oneDNN) stream them at
about 60% of the read bandwidth at one row. The kernel is a few dozen lines; building it
takes under a second and needs no PyTorch headers. Without a compiler (or with
TOKENTRACE_CPU_KERNELS=0) `library()` is None and the layers keep PyTorch's paths.
ctypes releases the GIL for the call, so a server's other threads run meanwhile.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.kernels import huge_pages

SOURCES = [Path(__file__).with_name(name) for name in ("cpu_linear.c", "cpu_linear16.c", "cpu_attention.c",
                                                        "cpu_norm.c", "cpu_layer.c", "cpu_stats.c", "cpu_moe.c",
                                                        "cpu_team.c", "cpu_rows.c", "cpu_probs.c")]
HEADERS = [Path(__file__).with_name(name) for name in ("cpu_vec.h", "cpu_layer.h")]  # part of every build's hash
ROWS_PER_BLOCK, COLS_PER_BLOCK = 8, 16  # the blocked layout of cpu_linear.c
MAX_ROWS = 32  # above this many rows (a prefill chunk) PyTorch's GEMM, built for it, takes over
CFLAGS = ["-O3", "-fopenmp", "-shared", "-fPIC"]
# 16-bit weights: their layout (cpu_linear16.c) has 32 columns to a block row, one cache line
COLS_PER_BLOCK_16 = 32
WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
KINDS = {torch.float32: 0, torch.bfloat16: 3, torch.float16: 4}  # a weight's kind in the C kernels
NEVER = 1 << 30
# By a build's vector width (tt_vector_bits), the fewest rows of x (a decode batch) that take
# cpu_rows.c's tiles (each weight block read, and a 16-bit one widened, once for up to 6 rows)
# rather than the 8-row tiles (once for every pair of rows); both give the same bits. Measured
# 2026-12-06, one thread, SmolLM2's matrices (docs/benchmarks.md "Batched decode"): AVX2 at 8
# rows float32 2.2x, bfloat16 1.7x, float16 14x faster, float16 1.2x at one row already; on
# AVX-512 the 8-row tiles stay faster at float32 (near the memory's speed to 16 rows) and at
# float16 up to 8 rows, and bfloat16 (VDPBF16PS) has tiles of its own. 128 bits: not measured
# faster (R = 1, 2 rows a pass), off.
ROW_TILES_FROM = {
    512: {torch.float32: NEVER, torch.bfloat16: 16, torch.float16: 16},  # bfloat16: where widened by shifts
    256: {torch.float32: 2, torch.bfloat16: 2, torch.float16: 1},
    128: {torch.float32: NEVER, torch.bfloat16: NEVER, torch.float16: NEVER},
}


def march() -> str:
    """The -march the kernels are built for: this CPU's own ("native"), or another where
    TOKENTRACE_CPU_MARCH says so (x86-64-v3: AVX2 and F16C, no AVX-512; x86-64-v2: neither),
    so that a machine with AVX-512 also runs, and tests, the paths of one without it."""
    return os.environ.get("TOKENTRACE_CPU_MARCH", "native")


def build_dir() -> Path:
    root = os.environ.get("TOKENTRACE_CACHE")
    return Path(root).parent / "kernels" if root else Path.home() / ".cache" / "tokentrace" / "kernels"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


class BuildError(RuntimeError):
    pass


def build(out_dir: Path | None = None, source: Path | None = None, arch: str | None = None) -> Path:
    """Compile the float kernels (SOURCES, one library), or another C file of this folder
    (cpu_quant.c), for this CPU, once: named by a hash of the sources, the compiler, its
    flags and the CPU's feature flags, and written atomically, so processes building at
    once (tensor-parallel ranks) agree."""
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler (gcc or cc) on PATH")
    files = SOURCES if source is None else [source]
    flags = [*CFLAGS, f"-march={arch or march()}"]
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(b"\0".join([*(p.read_bytes() for p in files + HEADERS), version.encode(),
                                     " ".join(flags).encode(), _cpu_flags().encode()])).hexdigest()[:16]
    out_dir = out_dir or build_dir()
    lib = out_dir / f"{'tokentrace_cpu' if source is None else source.stem}-{key}.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        tmp_lib = Path(tmp) / lib.name
        done = subprocess.run([cc, *flags, *map(str, files), "-o", str(tmp_lib), "-lm"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(f"{cc} failed on {', '.join(p.name for p in files)}:\n{done.stderr.strip()}")
        os.replace(tmp_lib, lib)
    return lib


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None where they cannot run (switched off, no compiler,
    a failed build): callers then keep PyTorch's path."""
    if os.environ.get("TOKENTRACE_CPU_KERNELS", "1") == "0":
        return None
    try:
        return load(march())
    except (BuildError, OSError):
        return None


@functools.cache
def load(arch: str) -> ctypes.CDLL:
    """The float kernels built for `arch` (see march()) and loaded, their signatures declared."""
    lib = ctypes.CDLL(str(build(arch=arch)))
    c_long, ptr = ctypes.c_long, ctypes.c_void_p
    lib.tt_linear_f32.argtypes = [ptr, c_long, c_long, ptr, c_long, c_long, ptr, ptr, c_long, ctypes.c_int]
    lib.tt_linear_f32.restype = None
    lib.tt_block_f32.argtypes = [ptr, c_long, c_long, ptr, ctypes.c_int]
    lib.tt_block_f32.restype = None
    lib.tt_decode_attention.argtypes = [ptr, ptr, ptr, ptr, c_long, ptr, c_long, c_long, c_long, c_long, c_long,
                                        ctypes.c_float, c_long, ptr, ctypes.c_int, ptr]
    lib.tt_decode_attention.restype = None
    lib.tt_rms_norm.argtypes = [ptr, c_long, c_long, c_long, ptr, ctypes.c_float, ctypes.c_float, ptr]
    lib.tt_rms_norm.restype = None
    lib.tt_decode_attention_block.argtypes = [ptr, ptr, c_long, ptr, ptr, ptr, ptr, c_long, ptr, ptr, ptr,
                                              ctypes.c_int, ptr]
    lib.tt_decode_attention_block.restype = ctypes.c_int
    lib.tt_decode_mlp_block.argtypes = [ptr, ptr, c_long, ctypes.c_int]
    lib.tt_decode_mlp_block.restype = ctypes.c_int
    lib.tt_dist_stats.argtypes = [ptr, c_long, c_long, c_long, ctypes.c_int, ptr, ptr, ctypes.c_int]
    lib.tt_dist_stats.restype = None
    for name in ("tt_linear_bf16", "tt_linear_f16"):
        getattr(lib, name).argtypes = [ptr, c_long, c_long, ptr, c_long, c_long, ptr, ptr, c_long, ctypes.c_int]
        getattr(lib, name).restype = ctypes.c_int
    lib.tt_linear_bf16_exact.argtypes = [ptr, c_long, c_long, ptr, c_long, c_long, ptr, ptr, c_long, c_long,
                                         ctypes.c_int]
    lib.tt_linear_bf16_exact.restype = ctypes.c_int
    lib.tt_block_16.argtypes, lib.tt_block_16.restype = [ptr, c_long, c_long, ptr, ctypes.c_int], None
    lib.tt_moe_forward.argtypes = [ptr, ptr, c_long, ptr, ptr, ctypes.c_int, ptr, ctypes.c_int]
    lib.tt_moe_forward.restype = ctypes.c_int
    lib.tt_moe_block.argtypes = [ptr, ptr, ctypes.c_float, ctypes.c_float, ptr, c_long, ptr, ptr, ctypes.c_int]
    lib.tt_moe_block.restype = ctypes.c_int
    lib.tt_blocked_rows.argtypes = [ptr, c_long, c_long, c_long, ptr, c_long, ptr]
    lib.tt_blocked_rows.restype = ctypes.c_int
    lib.tt_decode_stack.argtypes = [ptr, c_long, ptr, ptr, c_long, ptr, ptr, c_long, c_long, c_long, ptr, ptr, ptr,
                                    c_long, ptr, ptr, ptr, ptr, ptr, ctypes.c_float, ctypes.c_float, ctypes.c_int,
                                    ctypes.c_int]
    lib.tt_decode_stack.restype = ctypes.c_int
    lib.tt_linear16_path.argtypes, lib.tt_linear16_path.restype = [], ctypes.c_int
    lib.tt_vector_bits.argtypes, lib.tt_vector_bits.restype = [], ctypes.c_int
    lib.tt_rows_set.argtypes, lib.tt_rows_set.restype = [c_long, ctypes.c_int], ctypes.c_int
    for dtype, rows in ROW_TILES_FROM[min(lib.tt_vector_bits(), 512)].items():
        lib.tt_rows_set(KINDS[dtype], rows)
    return lib


def available() -> bool:
    return library() is not None


HUGE_PAGE = huge_pages.HUGE_PAGE


def huge_page_empty(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised CPU tensor on memory that asks Linux for 2 MB pages, before it is first
    written (huge_pages: why, and how tensors under 2 MB get them too). With
    4 KB pages a decode step takes a TLB miss every 4 KB it streams (SmolLM2: 135,000 a step);
    2 MB pages spare it almost all of them."""
    return huge_pages.empty(shape, dtype)


def huge_page_zeros(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """huge_page_empty's zeroed twin, its pages resident only once written (huge_pages.zeros)."""
    return huge_pages.zeros(shape, dtype)


def release_freed_memory() -> None:
    """Give the C heap's free pages back to the system (glibc's malloc_trim), best effort.

    Why: a load frees as much as it keeps (the float32 parameters once blocked, a GGUF's
    dequantized tensors), and glibc keeps freed blocks under its growing mmap threshold in
    the heap, resident: SmolLM2 at float32 held ~400 MB more than its weights and KV pool."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@dataclass
class BlockedWeight:
    """A weight [out, in] in the C kernels' blocked layout, padded with zeros to whole
    blocks: float32 [out/8, in/16, 8, 16] (cpu_linear.c), or bfloat16 / float16
    [out/8, in/32, 8, 32] (cpu_linear16.c). Where it is a layer's only copy of its weight,
    `rows` and `unblocked` read it back."""
    data: torch.Tensor
    out_features: int
    in_features: int

    @classmethod
    def of(cls, w: torch.Tensor, dtype: torch.dtype = torch.float32) -> "BlockedWeight":
        """w [out, in] of any float dtype, stored as `dtype` (rounded to nearest even)."""
        n, k = w.shape
        w = w.detach().to(dtype).contiguous()
        lib = library()
        if lib is None:
            return cls(block_reference(w), n, k)
        data = huge_page_empty(blocked_shape(n, k, dtype), dtype)
        block = lib.tt_block_f32 if dtype == torch.float32 else lib.tt_block_16
        block(w.data_ptr(), n, k, data.data_ptr(), torch.get_num_threads())  # ~3x the torch copy
        return cls(data, n, k)

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of the weight as float32 [*ids.shape, in]: an embedding's lookup where a
        tied LM head's blocked copy is the only one."""
        flat = ids.reshape(-1).to(torch.long)
        lib = library()
        if lib is not None and flat.device.type == "cpu":  # one C call (a decode step's lookup)
            flat = flat.contiguous()
            out = torch.empty(flat.shape[0], self.in_features, dtype=torch.float32)
            kind = KINDS[self.dtype]
            if lib.tt_blocked_rows(self.data.data_ptr(), kind, self.out_features, self.in_features, flat.data_ptr(),
                                   flat.shape[0], out.data_ptr()):
                raise IndexError(f"token id out of range for an embedding of {self.out_features} rows")
            return out.view(*ids.shape, self.in_features)
        rb = ROWS_PER_BLOCK
        picked = self.data[flat // rb, :, flat % rb, :]  # [n, in/cols, cols]
        return picked.reshape(flat.shape[0], -1)[:, :self.in_features].float().view(*ids.shape, self.in_features)

    def unblocked(self) -> torch.Tensor:
        """The weight [out, in] in its stored dtype, row-major: a fresh copy."""
        d = self.data
        return d.permute(0, 2, 1, 3).reshape(d.shape[0] * d.shape[2], -1)[:self.out_features, :self.in_features] \
            .contiguous()


def blocked_stack(w: torch.Tensor, dtype: torch.dtype) -> list[BlockedWeight]:
    """Each of w's matrices [E, out, in] (a MoE's experts) in the kernels' layout, one after
    another in one tensor [E, *blocked_shape] (cpu_moe.c reads them at a fixed stride)."""
    E, n, k = w.shape
    data = huge_page_empty((E, *blocked_shape(n, k, dtype)), dtype)
    for e in range(E):
        data[e].copy_(BlockedWeight.of(w[e], dtype).data)
    return [BlockedWeight(data[e], n, k) for e in range(E)]


def blocked_shape(n: int, k: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    cb = COLS_PER_BLOCK if dtype == torch.float32 else COLS_PER_BLOCK_16
    return -(-n // ROWS_PER_BLOCK), -(-k // cb), ROWS_PER_BLOCK, cb


def block_reference(w: torch.Tensor) -> torch.Tensor:
    """The blocked layout by plain torch ops, in w's dtype (the test oracle for tt_block_f32
    and tt_block_16)."""
    n, k = w.shape
    nb, kc, rb, cb = blocked_shape(n, k, w.dtype)
    padded = torch.zeros(nb * rb, kc * cb, dtype=w.dtype)
    padded[:n, :k] = w
    return padded.view(nb, rb, kc, cb).permute(0, 2, 1, 3).contiguous()


def blocked_weight(w: torch.Tensor, dtype: torch.dtype | None = None) -> BlockedWeight | None:
    """w in the kernels' layout, stored as `dtype` (default: w's own), or None where the
    kernels do not apply (not a float CPU matrix, or no kernels on this machine)."""
    dtype = dtype or w.dtype
    if w.device.type != "cpu" or not w.is_floating_point() or dtype not in WEIGHT_DTYPES or w.dim() != 2 \
            or library() is None:
        return None
    return BlockedWeight.of(w, dtype)


def compute_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype a pass computes in when its weights are `dtype`: float32 where the C kernels
    run 16-bit weights (a CPU with the kernels built: the weights stay 16-bit in their
    layout, the activations, KV pool and sums float32), else `dtype` itself."""
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16) and library() is not None:
        return torch.float32
    return dtype


def operands(x2: torch.Tensor, bias: torch.Tensor | None, out_features: int):
    """A linear kernel's operands: x's rows [T, in] as it reads them (float32, unit stride
    along a row; the row stride is passed), the bias float32 and contiguous, and the
    float32 output [T, out] it fills."""
    if x2.stride(-1) != 1 or x2.dtype != torch.float32:
        x2 = x2.float().contiguous()
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        bias = bias.float().contiguous()
    return x2, bias, torch.empty(x2.shape[0], out_features, dtype=torch.float32)


def blocked_bytes(model: torch.nn.Module) -> int:
    """Memory held by the kernels' blocked weights in a model: every BlockedWeight a module
    keeps (a Linear's; a MoE block's experts, through their `blocked_weights()`), a storage
    shared by two of them counted once, by its largest user (a storage's own size also
    counts the unused lead-in that puts a huge_page_empty tensor on a 2 MB boundary: address
    space, never written). Where the kernels run, these are the weights' only copies."""
    storages: dict[int, int] = {}
    for w in blocked_weights(model):
        ptr = w.data.data_ptr()
        storages[ptr] = max(storages.get(ptr, 0), w.nbytes)
    return sum(storages.values())


def blocked_weights(model: torch.nn.Module) -> list[BlockedWeight]:
    """Every BlockedWeight a module of the model keeps (a Linear's; a MoE block's experts,
    through their `blocked_weights()`), each once."""
    seen: set[int] = set()
    out: list[BlockedWeight] = []
    for m in model.modules():
        for value in vars(m).values():
            items = value.blocked_weights() if hasattr(value, "blocked_weights") else \
                value if isinstance(value, (list, tuple)) else [value]
            for w in items:
                if isinstance(w, BlockedWeight) and id(w) not in seen:
                    seen.add(id(w))
                    out.append(w)
    return out


# Past MAX_ROWS (a prefill chunk), the rows up to which the C kernel still beats widening the
# blocked copy back for PyTorch's GEMM, on an AVX-512 build (measured 2026-12-04, SmolLM2's
# matrices, one thread; docs/benchmarks.md "Prefill"): at 37 rows float32 1.56x, float16 1.44x,
# bfloat16 (VDPBF16PS) 3.5x; at 512 rows float32 / float16 0.9x / 0.8x, bfloat16 2.2x. An
# AVX2 build's kernels are 4-20x slower than the GEMM there, so it keeps MAX_ROWS. bfloat16 on
# a CPU with AMX stops at AMX_BF16_ROWS, a decode batch's most in the benchmarks: past it the AMX
# tiles (cpu_amx.c, each weight read once) win even with the layer's ops in PyTorch. 2026-12-06,
# one thread, CPU time, loaded: one layer's matrices at 16 / 37 / 100 rows 1.07 / 2.37 / 6.17 ms
# in C, 0.58 / 0.75 / 1.14 on the tiles; a SmolLM2 37-token TTFT 92.7 -> 66.1 ms (64 rows before).
PREFILL_KERNEL_ROWS = {torch.float32: 128, torch.float16: 128, torch.bfloat16: 1 << 40}
AMX_BF16_ROWS = 16


@functools.cache
def amx_bf16() -> bool:
    """Whether oneDNN multiplies bfloat16 on this CPU's matrix unit (AMX tiles), so a prefill
    chunk's bfloat16 products go there (engine/layers/prefill_gemm.py). ONEDNN_MAX_CPU_ISA
    without AMX in it (a run that stands in for an AVX2 machine) says no."""
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    if "amx_bf16" not in _cpu_flags().split() or not (isa == "ALL" or "AMX" in isa):
        return False
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported() and torch._C._cpu._init_amx())


@functools.cache
def kernel_rows(dtype: torch.dtype) -> int:
    """The most rows of x a blocked weight of `dtype` multiplies in the C kernel; above, the
    layer hands the copy to PyTorch's GEMM (engine/layers/prefill_gemm.py)."""
    lib = library()
    if lib is None or lib.tt_vector_bits() < 512:
        return MAX_ROWS
    if dtype == torch.bfloat16 and amx_bf16():
        return AMX_BF16_ROWS
    if dtype == torch.bfloat16 and not lib.tt_linear16_path():  # bfloat16 by shifts: as float16
        dtype = torch.float16
    return max(MAX_ROWS, PREFILL_KERNEL_ROWS[dtype])


LINEAR_FNS = {torch.float32: "tt_linear_f32", torch.bfloat16: "tt_linear_bf16", torch.float16: "tt_linear_f16"}


def as_multiplied(x: torch.Tensor, dtype: torch.dtype, exact_rows: int = 0) -> torch.Tensor:
    """x as float32 the way the kernels for weights of `dtype` multiply it: rounded to bfloat16
    (nearest even) for bfloat16 weights, whose kernel multiplies bfloat16 by bfloat16
    (cpu_linear16.c), as it is otherwise; the first `exact_rows` rows (the logit lens's) kept
    as they are. The GEMM over MAX_ROWS rows and the tests' oracle take it, so every path
    forms the same products."""
    if dtype != torch.bfloat16:
        return x.float()
    if exact_rows <= 0:
        return x.to(torch.bfloat16).float()
    x = x.float()
    return torch.cat([x[:exact_rows], x[exact_rows:].to(torch.bfloat16).float()])


def linear(x: torch.Tensor, w: BlockedWeight, bias: torch.Tensor | None = None,
           lib: ctypes.CDLL | None = None, exact_rows: int = 0) -> torch.Tensor:
    """x [..., in] @ W.T (+ bias) -> [..., out] float32, any number of rows (fastest at a
    few: see MAX_ROWS), W float32 or 16-bit. lib: another build (see load) than library().
    exact_rows: at bfloat16, the first rows of x kept to 16 mantissa bits, not rounded (the
    logit lens's rows, in the same pass as the model's own: cpu_linear16.c)."""
    lib = lib or library()
    assert lib is not None, "linear() needs the CPU kernels (see available())"
    lead = x.shape[:-1]
    x2, bias, y = operands(x.reshape(-1, w.in_features), bias, w.out_features)
    T = x2.shape[0]
    if T and exact_rows > 0 and w.dtype == torch.bfloat16:
        rc = lib.tt_linear_bf16_exact(
            x2.data_ptr(), T, x2.stride(0), w.data.data_ptr(), w.out_features, w.in_features,
            None if bias is None else bias.data_ptr(), y.data_ptr(), w.out_features, exact_rows,
            torch.get_num_threads())
    elif T:
        rc = getattr(lib, LINEAR_FNS[w.dtype])(
            x2.data_ptr(), T, x2.stride(0), w.data.data_ptr(), w.out_features, w.in_features,
            None if bias is None else bias.data_ptr(), y.data_ptr(), w.out_features, torch.get_num_threads())
        if rc:  # the 16-bit kernels' padded copy of x could not be allocated
            raise MemoryError(f"cpu_linear16: no memory for {T} padded rows of {w.in_features}")
    return y.view(*lead, w.out_features)


MAX_GROUP, MAX_HEAD_DIM = 16, 512  # cpu_attention.c's stack buffers


def attention_fits(heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether cpu_attention.c's stack buffers hold these heads."""
    return heads // kv_heads <= MAX_GROUP and head_dim <= MAX_HEAD_DIM


def attention_applies(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether decode_attention takes these: float32 CPU tensors within its buffers."""
    return (q.device.type == "cpu" and q.dtype == torch.float32 and k_cache.dtype == torch.float32
            and attention_fits(q.shape[1], k_cache.shape[2], q.shape[-1]) and available())


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                     context_lens: torch.Tensor, scale: float, window: int | None) -> torch.Tensor:
    """One query per sequence over its paged keys, read in place (cpu_attention.c).
    q [B, H, D]; caches [num_blocks, block_size, KVH, D]; block_tables [B, W]; context_lens [B]
    (the new token's key included) -> [B, H, D]."""
    B, H, D = q.shape
    _, bs, kvh, _ = k_cache.shape
    q = q.contiguous()
    tables = block_tables.to(torch.int64).contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and H % kvh == 0
    out = torch.empty_like(q)
    library().tt_decode_attention(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
                                  tables.shape[1], lens.data_ptr(), B, H, kvh, D, bs, scale, window or 0,
                                  out.data_ptr(), torch.get_num_threads(), None)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    """x / rms(x) * (weight + offset) over the last dim of a float32 CPU tensor (cpu_norm.c)."""
    H = x.shape[-1]
    x2 = x.reshape(-1, H)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    w = weight.detach()
    if w.dtype != torch.float32 or not w.is_contiguous():
        w = w.float().contiguous()
    y = torch.empty(x2.shape, dtype=torch.float32)
    library().tt_rms_norm(x2.data_ptr(), x2.shape[0], H, x2.stride(0), w.data_ptr(), offset, eps, y.data_ptr())
    return y.view(x.shape)
