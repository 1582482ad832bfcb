"""A decoder layer over a few rows in two C calls (engine/kernels/cpu_layer.c), where it applies.

A CPU decode step at a few rows spends most of its time streaming weights, which the C
linear kernel does near the memory's speed; what is left is ~15 small PyTorch ops a
layer around the matmuls, each paying PyTorch's dispatch and Python: a large share of a
SmolLM2 step (benchmarks/bench/step_overhead.py). The fused call runs the same kernels
with that glue in C.

The attention half applies to a Llama-style layer (RMSNorm, attention with RoPE, no
clipping; Qwen3's and Gemma 3's per-head q/k norms and Gemma's sandwich norms too) whose
q/k/v and o projections run in the C kernels (blocked float32 / bfloat16 / float16 weights, or int8 / int4
records), on up to 32 float32 CPU rows of a pass (up to 128 on an AVX-512 build's float32 and
float16 weights: kernels.cpu.kernel_rows): a decode step, a speculative verify pass, a
prefill chunk (every row attends as a query of its own, over its sequence's pages). The MLP half too where it is a dense SwiGLU or GeGLU on such
weights, while a MoE block runs its own modules after the fused attention. Everything
else (longer prefill chunks, OLMoE's whole-projection norms and clipping, sharded
layers, PyTorch's quantized kernels) takes the modules. A `full` trace still gets what it reads from a
layer: the rotated queries and the MoE routing, kept in its PassCapture.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

from engine.batch import ForwardBatch
from engine.kernels import cpu as cpu_kernels
from engine.kernels import cpu_quant
from engine.layers import linear
from engine.layers.linear import Linear
from engine.layers.mlp import ACTIVATIONS, MLP, SparseMoE
from engine.trace import pass_probs
from engine.trace.arena import Arena, Slice
from engine.trace.capture import PassCapture

_P, _L, _F = ctypes.c_void_p, ctypes.c_long, ctypes.c_float


class Proj(ctypes.Structure):
    """cpu_layer.c's tt_proj: a projection's weight, bias and kind (0 float32, 1 int8, 2 int4,
    3 bfloat16, 4 float16)."""
    _fields_ = [("w", _P), ("bias", _P), ("kind", _L)]


class LayerArgs(ctypes.Structure):
    """cpu_layer.c's tt_layer, field for field."""
    _fields_ = [("hidden", _L), ("heads", _L), ("kv_heads", _L), ("head_dim", _L), ("inter", _L),
                ("block_size", _L), ("window", _L), ("eps", _F), ("norm_offset", _F), ("scale", _F),
                ("norm1", _P), ("norm2", _P), ("qkv", Proj), ("o", Proj), ("gate_up", Proj), ("down", Proj),
                ("k_cache", _P), ("v_cache", _P), ("linear_q8", _P), ("linear_q4", _P),
                ("q_norm", _P), ("k_norm", _P), ("post_attn_norm", _P), ("post_mlp_norm", _P), ("gelu", _L)]


KINDS = {"int8": 1, "int4": 2}
FLOAT_KINDS = {torch.float32: 0, torch.bfloat16: 3, torch.float16: 4}
# A dense pass's layers in one OpenMP region (cpu_team.c): same values as one region a matrix
# (tests compare the two by switching this off), fewer forks and joins and an idle bus between matrices.
TEAM = True


def _weight(m: nn.Module):
    """What the C code multiplies by for this projection: its blocked float32 / 16-bit copy or its
    int8 / int4 records (None where it has neither: PyTorch runs it)."""
    if type(m) is not Linear:
        return None
    if m.qweight is not None:
        return m.qweight if m.qweight.blocked is not None else None
    return m.blocked


@dataclass
class FusedLayer:
    """The arguments of one layer, and what they point into, kept alive here: the plan is
    rebuilt when a projection's weight copy or the KV pool is replaced, or the layer's
    sliding window or RoPE table changes."""
    args: LayerArgs
    mlp: bool  # the MLP half fused too (a dense SwiGLU, or a MoE: see moe); else the layer's own MLP runs it
    weights: list[tuple[Linear, object]]  # each fused projection and the weight it had then
    keep: tuple  # the float32 norm weights and biases, the cache views
    generation: int  # linear's count of weight-copy changes when planned
    moe: tuple | None = None  # a SparseMoE half in one C call: (its CpuExperts, its router, the norm's weight)
    rope: str = "global"  # the layer's RoPE table when planned: the one-call stack picks its table by it
    max_rows: int = cpu_kernels.MAX_ROWS  # the most rows of a pass it takes (_max_rows)

    def current(self, layer: nn.Module) -> bool:
        attn = layer.self_attn
        return self.generation == linear.generation() and self.keep[0].data_ptr() == attn.k_cache.data_ptr() \
            and self.args.window == (attn.window or 0) and self.rope == attn.rope


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().float().contiguous()


def _proj(m: Linear, bias: torch.Tensor | None) -> Proj:
    w = _weight(m)
    if m.qweight is not None:
        return Proj(w.blocked.data.data_ptr(), None if bias is None else bias.data_ptr(), KINDS[w.kind])
    return Proj(w.data.data_ptr(), None if bias is None else bias.data_ptr(), FLOAT_KINDS[w.dtype])


def plan(layer: nn.Module) -> FusedLayer | None:
    """The fused calls' arguments for this DecoderLayer (whose `fusable` says the attention
    half is of the kind the C code runs), or None where its weights are not the C kernels'."""
    attn, mlp = layer.self_attn, layer.mlp
    cache = attn.k_cache
    if _weight(attn.qkv_proj) is None or _weight(attn.o_proj) is None or cache.dtype != torch.float32 \
            or cache.device.type != "cpu" or not cache.is_contiguous() or cpu_kernels.library() is None \
            or not cpu_kernels.attention_fits(attn.num_heads, attn.num_kv_heads, attn.head_dim):
        return None
    # the norms, in the order the layer applies them (None: it has none there); the C code
    # takes one eps and offset for all, which every model here shares between its norms
    n1 = layer.input_layernorm
    qn, kn = (attn.q_norm, attn.k_norm) if attn.qk_norm == "head" else (None, None)
    post_attn, n2, post_mlp = (layer.post_attention_layernorm, layer.pre_feedforward_layernorm,
                               layer.post_feedforward_layernorm) if layer.sandwich \
        else (None, layer.post_attention_layernorm, None)
    if any(n is not None and (n.offset, n.eps) != (n1.offset, n1.eps) for n in (qn, kn, post_attn)):
        return None
    fuse_mlp = type(mlp) is MLP and mlp.act in (ACTIVATIONS["silu"], ACTIVATIONS["gelu_pytorch_tanh"]) \
        and _weight(mlp.gate_up_proj) is not None and _weight(mlp.down_proj) is not None \
        and all(n is None or (n.offset, n.eps) == (n1.offset, n1.eps) for n in (n2, post_mlp))
    linears = [attn.qkv_proj, attn.o_proj] + ([mlp.gate_up_proj, mlp.down_proj] if fuse_mlp else [])
    w1, w2 = _f32(n1.weight), _f32(n2.weight)
    extra = [_f32(n.weight) if n is not None else None for n in (qn, kn, post_attn, post_mlp if fuse_mlp else None)]
    biases = [_f32(m.bias) for m in linears]
    projs = [_proj(m, b) for m, b in zip(linears, biases)] + [Proj(), Proj()]
    quant = cpu_quant.library() if any(m.qweight is not None for m in linears) else None
    fn = lambda name: None if quant is None else ctypes.cast(getattr(quant, name), _P).value  # noqa: E731
    args = LayerArgs(
        hidden=attn.qkv_proj.in_features, heads=attn.num_heads, kv_heads=attn.num_kv_heads,
        head_dim=attn.head_dim, inter=mlp.down_proj.in_features if fuse_mlp else 0,
        block_size=cache.shape[1], window=attn.window or 0, eps=n1.eps,
        norm_offset=1.0 if n1.offset else 0.0, scale=attn.scale, norm1=w1.data_ptr(), norm2=w2.data_ptr(),
        qkv=projs[0], o=projs[1], gate_up=projs[2], down=projs[3],
        k_cache=cache.data_ptr(), v_cache=attn.v_cache.data_ptr(),
        linear_q8=fn("tt_linear_q8"), linear_q4=fn("tt_linear_q4"),
        q_norm=_ptr(extra[0]), k_norm=_ptr(extra[1]), post_attn_norm=_ptr(extra[2]), post_mlp_norm=_ptr(extra[3]),
        gelu=int(fuse_mlp and mlp.act is ACTIVATIONS["gelu_pytorch_tanh"]))
    moe = _moe_half(layer) if not fuse_mlp else None
    return FusedLayer(args, fuse_mlp or moe is not None, [(m, _weight(m)) for m in linears],
                      (cache, attn.v_cache, w1, w2, *extra, *biases), linear.generation(), moe, attn.rope,
                      _max_rows(linears, moe))


def _moe_half(layer: nn.Module) -> tuple | None:
    """A plain SparseMoE on the C kernels (softmax router, no shared expert) after a plain
    RMSNorm: its whole half as one C call (cpu_moe.c's tt_moe_block)."""
    mlp, norm = layer.mlp, layer.post_attention_layernorm
    if type(mlp) is not SparseMoE or mlp.c_experts is None or mlp.gate.blocked is None \
            or mlp.shared_expert is not None or layer.sandwich:
        return None
    return mlp.c_experts, mlp.gate.blocked, _f32(norm.weight)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def applies(x: torch.Tensor, batch: ForwardBatch, rows: int = cpu_kernels.MAX_ROWS) -> bool:
    """Whether this pass's rows can take the fused layer: float32 CPU rows, at most `rows` of
    them (a plan's max_rows: as many as its weights' C kernel takes, kernels.cpu.kernel_rows;
    a decode step, a speculative verify pass, a prefill chunk; not a padded static batch,
    whose lengths only its device may read)."""
    return (x.dtype == torch.float32 and x.device.type == "cpu" and not batch.use_triton
            and not batch.static_shapes and x.shape[0] <= rows)


PREFILL_ROWS = 128  # past it a chunk's attention is SDPA's flash kernel's work, not a query per row


def widest_rows() -> int:
    """The most rows any plan can take (its max_rows at most)."""
    return min(PREFILL_ROWS, max(cpu_kernels.kernel_rows(d) for d in cpu_kernels.WEIGHT_DTYPES))


def _max_rows(linears: list[Linear], moe: tuple | None) -> int:
    """A plan's rows: up to the C kernel's rows for its float weights' dtypes (a prefill chunk
    of 37 tokens in C calls, not ~15 PyTorch ops a layer: 20% less CPU time for SmolLM2 at
    float32, 2026-12-06); MAX_ROWS with quantized weights or a MoE half."""
    if moe is not None or any(m.qweight is not None for m in linears):
        return cpu_kernels.MAX_ROWS
    return min(PREFILL_ROWS, *(cpu_kernels.kernel_rows(m.blocked.dtype) for m in linears))


def forward(fused: FusedLayer, layer: nn.Module, x: torch.Tensor, batch: ForwardBatch,
            capture: PassCapture | None = None) -> torch.Tensor:
    """The pass's rows x [T, hidden] after the layer's attention half, and after its MLP half
    too where `fused.mlp` (else the layer runs its own MLP or MoE on the result; see applies)."""
    attn = layer.self_attn
    T = x.shape[0]
    x = x.contiguous()
    cos, sin = (t.reshape(T, -1) for t in batch.rope[attn.rope])
    tables, keys = batch.row_keys  # every row a query of its own over its sequence's pages
    out = torch.empty_like(x)
    q = None
    if capture is not None and attn.layer_idx in capture.attention_layers:  # read after the pass
        q = torch.empty(T, attn.num_heads, attn.head_dim)
        capture.layer_q[attn.layer_idx] = q
    lib, threads = cpu_kernels.library(), torch.get_num_threads()
    rc = lib.tt_decode_attention_block(
        ctypes.byref(fused.args), x.data_ptr(), T, cos.data_ptr(), sin.data_ptr(), batch.slot_mapping.data_ptr(),
        tables.data_ptr(), tables.shape[1], keys.data_ptr(),
        out.data_ptr(), None if q is None else q.data_ptr(), threads, None)
    if not rc and fused.moe is not None:
        rc = _moe_forward(fused, layer, out, capture, threads)
    elif not rc and fused.mlp:
        rc = lib.tt_decode_mlp_block(ctypes.byref(fused.args), out.data_ptr(), T, threads)
    if rc:
        raise MemoryError(f"cpu_layer: no memory for the scratch rows of {T} tokens")
    return out


def _moe_forward(fused: FusedLayer, layer: nn.Module, x: torch.Tensor, capture: PassCapture | None,
                 threads: int) -> int:
    """x += the MoE half of x (norm, routing, experts) in place; the routing kept for a trace."""
    experts_, router, norm_w = fused.moe
    args, norm = experts_.args, layer.post_attention_layernorm
    args.router, args.router_kind = router.data.data_ptr(), FLOAT_KINDS[router.dtype]
    T = x.shape[0]
    experts = torch.empty(T, args.top_k, dtype=torch.long)
    weights = torch.empty(T, args.top_k, dtype=torch.float32)
    rc = cpu_kernels.library().tt_moe_block(ctypes.byref(args), norm_w.data_ptr(), 1.0 if norm.offset else 0.0,
                                            norm.eps, x.data_ptr(), T, experts.data_ptr(), weights.data_ptr(),
                                            threads)
    if capture is not None:  # a full trace: converted after the pass (PassCapture)
        capture.moe_routing[layer.mlp.layer_idx] = (experts, weights)
    return rc


class StackLayer(ctypes.Structure):
    """cpu_layer.c's tt_stack_layer, field for field."""
    _fields_ = [("layer", _P), ("moe", _P), ("moe_norm", _P), ("moe_offset", _F), ("moe_eps", _F), ("rope", _L)]


@dataclass
class FusedStack:
    """Every layer of the model in one C call (cpu_layer.c's tt_decode_stack): the layers' plans
    it was built from (rebuilt when one of them is), their arguments, the RoPE tables by name."""
    plans: list[FusedLayer]
    layers: ctypes.Array
    ropes: list[str]
    top_k: int
    final_norm: torch.Tensor  # the model's last RMSNorm weight, applied inside the call
    tables: list[tuple[torch.Tensor, torch.Tensor]]  # each RoPE table's (cos, sin) whole, read by position
    fits: bool  # the tables and the norm are what the call reads (else the layers run one by one)
    # for a `full` trace's captures: each layer's (query heads, head dim), and each MoE layer's top_k
    q_shapes: list[tuple[int, int]] = field(default_factory=list)
    moe_top_k: dict[int, int] = field(default_factory=dict)
    moe_all: bool = field(init=False)  # every layer a MoE's, with the stack's top_k: the routing kept whole
    layouts: dict = field(default_factory=dict)  # pass_probs.plan's arrays, kept between passes
    arena: Arena = field(default_factory=Arena)  # where a pass's probabilities and lens rows are written
    no_q: ctypes.Array = field(init=False)  # no layer's queries kept (the pass writes the probabilities)
    windows: list[int | None] = field(init=False)  # each layer's sliding window (None: global)
    rope_ptrs: tuple[ctypes.Array, ctypes.Array] = field(init=False)  # the tables' cos and sin addresses
    # the call's capture argument where the pass writes the probabilities (its addresses set each pass)
    cap: "StackCapture" = field(init=False)

    def __post_init__(self) -> None:
        self.moe_all = len(self.moe_top_k) == len(self.plans) and all(k == self.top_k for k in self.moe_top_k.values())
        self.no_q = (_P * len(self.plans))()
        self.windows = [p.args.window or None for p in self.plans]
        self.rope_ptrs = tuple((_P * len(self.tables))(*[pair[i].data_ptr() for pair in self.tables]) for i in (0, 1))
        self.cap = StackCapture(ctypes.addressof(self.no_q), top_k=self.top_k)


def stack(model: nn.Module, x: torch.Tensor, batch: ForwardBatch) -> FusedStack | None:
    """The one-call plan for a DecoderModel's pass, where every layer takes both its halves in C
    (else None: the layers run one by one). Kept on the model between passes."""
    plans = []
    for layer in model.layers:
        plan = layer._fused_plan(x, batch)
        if plan is None or not plan.mlp:
            return None
        plans.append(plan)
    st = model.__dict__.get("_fused_stack")
    if st is None or len(st.plans) != len(plans) or any(a is not b for a, b in zip(st.plans, plans)) \
            or not all(t is u for name, pair in zip(st.ropes, st.tables) for t, u in zip(pair, _rope_table(model, name))):
        st = _build_stack(model, plans)
        model.__dict__["_fused_stack"] = st
    return st if st.fits else None


def _build_stack(model: nn.Module, plans: list[FusedLayer]) -> FusedStack:
    ropes = sorted({layer.self_attn.rope for layer in model.layers})
    rows, top_k = [], 1
    for layer, plan in zip(model.layers, plans):
        row = StackLayer(layer=ctypes.addressof(plan.args), rope=ropes.index(layer.self_attn.rope))
        if plan.moe is not None:
            experts_, router, norm_w = plan.moe
            experts_.args.router, experts_.args.router_kind = router.data.data_ptr(), FLOAT_KINDS[router.dtype]
            norm = layer.post_attention_layernorm
            row.moe, row.moe_norm = ctypes.addressof(experts_.args), norm_w.data_ptr()
            row.moe_offset, row.moe_eps = 1.0 if norm.offset else 0.0, norm.eps
            top_k = max(top_k, experts_.args.top_k)
        rows.append(row)
    tables = [_rope_table(model, name) for name in ropes]
    fits = _tables_fit(tables, model.layers[0].self_attn.head_dim) and model.norm.weight.dtype == torch.float32
    return FusedStack(plans, (StackLayer * len(rows))(*rows), ropes, top_k, model.norm.weight.detach(), tables, fits,
                      [(p.args.heads, p.args.head_dim) for p in plans],
                      {i: p.moe[0].args.top_k for i, p in enumerate(plans) if p.moe is not None})


class Probs(ctypes.Structure):
    """cpu_layer.h's tt_probs, field for field."""
    _fields_ = [("out", _P), ("rows", _P), ("layer", _L)]


class StackCapture(ctypes.Structure):
    """cpu_layer.h's tt_stack_capture, field for field."""
    _fields_ = [("q", _P), ("experts", _P), ("weights", _P), ("top_k", _L), ("resid", _P), ("probs", Probs),
                ("probs_at", _P)]


def stack_forward(st: FusedStack, x: torch.Tensor, batch: ForwardBatch, model: nn.Module,
                  capture: PassCapture | None = None) -> torch.Tensor:
    """The final norm of x [T, hidden] after every layer, in one C call (see stack). The RoPE
    rows are read from the model's whole tables at the batch's positions inside the call; a
    `full` trace's captures (each captured layer's queries, each MoE layer's routing, the logit
    lens's residual stream) are written by the same call into the tensors `capture` then holds.
    x is the pass's own fresh embedding rows, which the call overwrites (copied first where a
    capture keeps views of them)."""
    T = x.shape[0]
    tables, (cos, sin) = st.tables, st.rope_ptrs
    rows, D = tables[0][0].shape
    block_tables, keys = batch.row_keys
    # a capture's embedding rows are views of x, which the call overwrites: x copied first, unless
    # every row is a lens row (a decode step's): then they are the lens's layer-0 rows (_stack_done)
    rows_in_resid = capture is not None and embed_rows_in_lens(capture, T)
    work = x.contiguous() if capture is None or rows_in_resid or not capture.embed_rows else x.clone()
    out = torch.empty_like(work)
    L = len(st.plans)
    kept = capture is not None
    if kept:  # every layer's routing [L, T, top_k] kept (what PassCapture.moe_all reads): int64 experts and
        n = L * T * st.top_k  # float32 weights in the arena, as tensors once the captures are read (_stack_done)
        experts, weights = st.arena.take(2 * n), st.arena.take(n)
        at = experts.address, weights.address
        cap, q, resid, probs = _stack_capture(st, capture, batch, T, x.shape[1], at)
    else:  # the call's scratch
        experts = torch.empty(1, T, st.top_k, dtype=torch.long)
        weights = torch.empty(1, T, st.top_k, dtype=torch.float32)
        at, cap, q, resid, probs = (experts.data_ptr(), weights.data_ptr()), None, None, None, None
    norm = model.norm
    rc = cpu_kernels.library().tt_decode_stack(
        st.layers, L, work.data_ptr(), out.data_ptr(), T, cos, sin, len(tables), rows, D,
        batch.positions.data_ptr(), batch.slot_mapping.data_ptr(), block_tables.data_ptr(), block_tables.shape[1],
        keys.data_ptr(), *at, None if cap is None else ctypes.byref(cap),
        st.final_norm.data_ptr(), 1.0 if norm.offset else 0.0, norm.eps, torch.get_num_threads(), int(TEAM))
    if rc == -2:
        raise IndexError(f"a position past the RoPE table's {rows} rows")
    if rc:
        raise MemoryError(f"cpu_layer: no memory for the scratch rows of {T} tokens")
    if kept:
        done = partial(_stack_done, st, capture, T, experts, weights, resid, x.shape[1], probs,
                       batch if rows_in_resid and capture.embed_rows else None)
        if probs is not None or not capture.attention_layers:  # no key read after the pass: when first read
            capture.pending.append(done)
        else:
            done()
    return out


def embed_rows_in_lens(capture: PassCapture, T: int) -> bool:
    """Whether every one of the pass's T rows is a lens row (a decode step's): the stack then takes
    the embedding rows from the lens's layer-0 rows after the call, and x needs no copy."""
    return capture.lens_rows is not None and len(capture.lens_rows) == T


def _stack_done(st: FusedStack, capture: PassCapture, T: int, experts: Slice, weights: Slice,
                resid: Slice | None, hidden: int, probs: pass_probs.PassProbs | None,
                embed_from: ForwardBatch | None) -> None:
    rows = None if resid is None else resid.tensor(-1, hidden)
    experts = experts.tensor(-1).view(torch.long).view(-1, T, st.top_k)
    weights = weights.tensor(-1, T, st.top_k)
    if embed_from is not None:  # the embedding rows: layer 0's input, the lens's first T rows
        for b in capture.embed_rows:
            capture.embed_rows[b] = rows[embed_from.seq_slice(b), :capture.specs[b].embed_dims]
    _stack_kept(st, capture, T, experts, weights, rows)
    if probs is not None:
        pass_probs.kept(probs, capture, st.windows)


def _rope_table(model: nn.Module, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    rotary = model.rotary if name == "global" else model.rotary_local
    return rotary.cos, rotary.sin


def _tables_fit(tables: list[tuple[torch.Tensor, torch.Tensor]], head_dim: int) -> bool:
    """Whether the one call can read RoPE rows straight from the model's tables: float32,
    contiguous, on the CPU, a row of head_dim (what the per-layer path's lookup gives)."""
    for pair in tables:
        for t in pair:
            if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous() or t.dim() != 2 \
                    or t.shape[1] != head_dim:
                return False
    return True


def _stack_capture(st: FusedStack, capture: PassCapture, batch: ForwardBatch, T: int, hidden: int,
                   routing: tuple[int, int]) -> tuple[StackCapture, ctypes.Array, Slice | None,
                                                      pass_probs.PassProbs | None]:
    """Where the stack's call writes what `capture` keeps: the attention probabilities, by the
    pass's own attention (pass_probs; else the captured layers' queries, for collect() after the
    pass: one tensor for all of them where their heads agree, as in every model here), every
    layer's routing (read back by _stack_kept), and, for a logit lens, every layer's input rows
    [L, T, hidden] (the probabilities and the rows in the stack's arena). -> the argument, what
    it points into (alive until the call returns), the rows and the probabilities' plan. routing: where
    the experts and weights go."""
    L = len(st.plans)
    probs = pass_probs.plan(capture, batch, st.q_shapes, st.layouts, st.arena)
    resid = st.arena.take(L * T * hidden) if capture.lens_rows is not None else None  # [L, T] rows, layer-major
    if probs is not None:  # the pass writes the probabilities: no queries kept, the stack's own argument
        cap = st.cap
        (cap.experts, cap.weights), cap.resid = routing, None if resid is None else resid.address
        cap.probs.out, cap.probs.rows, cap.probs_at = probs.out.address, ctypes.addressof(probs.rows), \
            ctypes.addressof(probs.at)
        return cap, st.no_q, resid, probs
    q = (_P * L)()
    layers = sorted(capture.attention_layers)
    shapes = {st.q_shapes[i] for i in layers}
    if len(shapes) == 1:
        qs = torch.empty(len(layers), T, *shapes.pop())
        capture.layer_q.update(zip(layers, qs.unbind(0)))
        capture.layer_q_all = qs if len(layers) == L else None
    else:
        capture.layer_q.update((i, torch.empty(T, *st.q_shapes[i])) for i in layers)
    for i in layers:
        q[i] = capture.layer_q[i].data_ptr()
    cap = StackCapture(ctypes.addressof(q), *routing, st.top_k, None if resid is None else resid.address)
    return cap, q, resid, None


def _stack_kept(st: FusedStack, capture: PassCapture, T: int, experts: torch.Tensor, weights: torch.Tensor,
                resid: torch.Tensor | None) -> None:
    """The stack's routing and residual stream into `capture`, as the layers one by one keep them
    (engine/model.py: the lens rows of every layer's input, layer after layer)."""
    if st.moe_top_k:
        if st.moe_all:
            capture.moe_all = experts, weights  # every layer a MoE's: one tensor each, no layer apart (PassCapture)
            return _lens_kept(capture, T, resid)
        stride = T * st.top_k
        flat_e, flat_w = experts.view(-1), weights.view(-1)
        by_layer = experts.unbind(0), weights.unbind(0)
        for i, k in st.moe_top_k.items():  # layer i's routing: the first T x k of its stride
            capture.moe_routing[i] = (by_layer[0][i], by_layer[1][i]) if k == st.top_k else \
                (flat_e[i * stride:i * stride + T * k].view(T, k), flat_w[i * stride:i * stride + T * k].view(T, k))
    _lens_kept(capture, T, resid)


def _lens_kept(capture: PassCapture, T: int, resid: torch.Tensor | None) -> None:
    if resid is not None:  # [L * lens rows, hidden], layer-major (logit_lens.kept_rows)
        lens = capture.lens_rows
        capture.lens_hidden = [resid if len(lens) == T else
                               resid.view(-1, T, resid.shape[1]).index_select(1, torch.tensor(lens)).flatten(0, 1)]
