"""Feed-forward blocks: the dense SwiGLU MLP and the sparse mixture of experts."""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from engine.batch import ForwardBatch
from engine.config import ModelConfig
from engine.kernels import cpu as cpu_kernels
from engine.layers.linear import Linear, pack_weight, packed_linear, weights_changed
from engine.layers.moe_cpu import CpuExperts
from engine.trace.capture import PassCapture


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": gelu_tanh}


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); gate and up fused into one matmul.
    With activation="gelu_pytorch_tanh" it is Gemma's GeGLU."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False, activation: str = "silu") -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias=bias)
        self.down_proj = Linear(intermediate, hidden, bias=bias)
        self.act = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor, batch: ForwardBatch | None = None,
                capture: PassCapture | None = None) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)


class SparseMoE(nn.Module):
    """Router softmax -> top-k -> (renormalise) -> weighted sum of the chosen experts,
    plus a gated shared expert where the model has one (Qwen2-MoE)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.top_k = cfg.num_experts_per_tok
        self.num_experts = cfg.num_experts
        self.norm_topk_prob = cfg.norm_topk_prob
        inter = cfg.moe_intermediate_size
        self.gate = Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts_gate_up = nn.Parameter(torch.empty(cfg.num_experts, 2 * inter, cfg.hidden_size))
        self.experts_down = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size, inter))
        self.shared_expert = None
        if cfg.shared_expert_intermediate_size:
            self.shared_expert = MLP(cfg.hidden_size, cfg.shared_expert_intermediate_size)
            self.shared_expert_gate = Linear(cfg.hidden_size, 1, bias=False)
        self.packed_gate_up = self.packed_down = None  # oneDNN copies of every expert (no C kernel: see pack)
        self.c_experts: CpuExperts | None = None  # the experts in the C kernels, their only copy (see pack)

    def pack(self, on: bool = True, dtype: torch.dtype | None = None) -> None:
        """On the CPU with the C kernels: every expert blocked (stored as `dtype`, default its
        own), then the only copy of them, run by cpu_moe.c (CpuExperts); without
        them, all experts side by side reordered for oneDNN (for _all_experts). off: the plain
        float32 parameters back."""
        weights_changed()
        if not on:
            if self.c_experts is not None:
                gate_up, down = self.c_experts.unblocked()
                self.experts_gate_up = nn.Parameter(gate_up, requires_grad=False)
                self.experts_down = nn.Parameter(down, requires_grad=False)
            self.c_experts = self.packed_gate_up = self.packed_down = None
            return
        if self.experts_gate_up is None:
            return
        gate_up, down = self.experts_gate_up.detach(), self.experts_down.detach()
        dtype = dtype or gate_up.dtype
        if gate_up.device.type == "cpu" and dtype in cpu_kernels.WEIGHT_DTYPES and cpu_kernels.available():
            self.c_experts = CpuExperts.of(gate_up, down, self.top_k, self.norm_topk_prob, dtype)
            self.experts_gate_up = self.experts_down = None
            return
        E, two_i, H = gate_up.shape
        self.packed_gate_up = pack_weight(gate_up.view(E * two_i, H))
        self.packed_down = None
        if self.packed_gate_up is not None:  # down is half gate/up's size: packed along with it
            self.packed_down = pack_weight(down.permute(1, 0, 2).reshape(H, -1), min_bytes=0)

    def forward(self, x: torch.Tensor, batch: ForwardBatch | None = None,
                capture: PassCapture | None = None) -> torch.Tensor:
        if self.c_experts is not None and x.device.type == "cpu" and self.gate.blocked is not None \
                and type(self).route is SparseMoE.route:  # routing and experts in one C call
            out, experts, weights = self.c_experts.forward(x, router=self.gate.blocked)
            out, weights = out.to(x.dtype), weights.to(x.dtype)
        else:
            experts, weights = self.route(x)
            weights = weights.to(x.dtype)
            out = self.routed(x, experts, weights, batch)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        if capture is not None:  # a full trace: converted after the pass (PassCapture)
            capture.moe_routing[self.layer_idx] = (experts, weights)
        return out

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(experts [T, k], weights [T, k] float32) of each token."""
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return experts, weights

    def routed(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
               batch: ForwardBatch | None) -> torch.Tensor:
        """The chosen experts' outputs, weighted and summed per token."""
        if self.c_experts is not None and x.device.type == "cpu":
            return self.c_experts.forward(x, experts=experts, weights=weights)[0].to(x.dtype)
        T = x.shape[0]
        static = batch is not None and batch.static_shapes  # a CUDA graph: no expert ids read on the host
        if T == 1 and not static:  # one decoding sequence: just its k experts, no bookkeeping
            out = self._one_token(x, experts[0].tolist(), weights[0].tolist())
        elif static or T <= 64 and 2 * T * self.top_k >= self.num_experts:
            out = self._all_experts(x, experts, weights)
        else:
            out = torch.zeros_like(x)
            load = torch.bincount(experts.flatten(), minlength=self.num_experts)
            for e in load.nonzero().flatten().tolist():
                token_idx, slot = torch.where(experts == e)
                y = self._expert(x[token_idx], e)
                out.index_add_(0, token_idx, y * weights[token_idx, slot, None])
        return out

    def _one_token(self, x: torch.Tensor, experts: list[int], weights: list[float]) -> torch.Tensor:
        """Its k experts one after another, in place where the reference's rounding allows
        (each expert's output times its weight, then summed, as transformers does)."""
        out = None
        for e, w in zip(experts, weights):
            gate, up = F.linear(x, self.experts_gate_up[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate).mul_(up), self.experts_down[e]).mul_(w)
            out = y if out is None else out.add_(y)
        return out

    def _expert(self, x: torch.Tensor, e: int) -> torch.Tensor:
        gate, up = F.linear(x, self.experts_gate_up[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.experts_down[e])

    def _all_experts(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Few tokens that together reach a good share of the experts (a decode batch): run
        every expert on every token in two matmuls and weight by the routing. Most weights are
        read either way; at a decode batch's few tokens one call per expert costs more than the
        extra math."""
        T = x.shape[0]
        route = torch.zeros(T, self.num_experts, dtype=x.dtype, device=x.device)
        route.scatter_(1, experts, weights)  # [T, E]: routing weight, 0 where not chosen
        if self.packed_gate_up is not None:
            # all experts side by side (oneDNN): [T, H] -> [T, E x 2I] -> [T, E x I] -> [T, H]; each
            # expert's activations scaled by its routing weight, so the second matmul sums them
            first, second = partial(packed_linear, packed=self.packed_gate_up), \
                partial(packed_linear, packed=self.packed_down)
            gate, up = first(x).view(T, self.num_experts, -1).chunk(2, dim=-1)
            return second((F.silu(gate) * up * route[:, :, None]).view(T, -1))
        gate, up = torch.matmul(x, self.experts_gate_up.transpose(1, 2)).chunk(2, dim=-1)  # [E, T, I]
        y = torch.matmul(F.silu(gate) * up, self.experts_down.transpose(1, 2))  # [E, T, H]
        return torch.einsum("te,eth->th", route, y)
