"""Feed-forward blocks: the dense SwiGLU MLP and the sparse mixture of experts."""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from engine.batch import ForwardBatch
from engine.config import ModelConfig
from engine.kernels import cpu as cpu_kernels
from engine.kernels.cpu import BlockedWeight
from engine.layers.linear import Linear, pack_weight, packed_linear
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
        self.packed_gate_up = self.packed_down = None  # oneDNN copies of every expert (see pack)
        self.blocked_gate_up = self.blocked_down = None  # the same for the C kernel, where it builds
        self.blocked_experts: list[tuple[BlockedWeight, BlockedWeight]] | None = None

    def pack(self, on: bool = True) -> None:
        """For _all_experts on the CPU: every expert side by side, gate/up as one [E x 2I, H]
        matrix and down as one [H, E x I], in the C kernel's layout (engine/kernels/cpu.py),
        and each expert on its own for a lone token; without the kernel, reordered for oneDNN."""
        gate_up, down = self.experts_gate_up.detach(), self.experts_down.detach()
        E, two_i, H = gate_up.shape
        self.blocked_gate_up = cpu_kernels.blocked_weight(gate_up.view(E * two_i, H)) if on else None
        self.blocked_down = self.blocked_experts = None
        if self.blocked_gate_up is not None:
            self.blocked_down = cpu_kernels.BlockedWeight.of(down.permute(1, 0, 2).reshape(H, -1))
            self.blocked_experts = [(self._expert_rows(e, two_i, H), cpu_kernels.BlockedWeight.of(down[e]))
                                    for e in range(E)]
        self.packed_gate_up = pack_weight(gate_up.view(E * two_i, H)) if on and self.blocked_gate_up is None else None
        self.packed_down = None
        if self.packed_gate_up is not None:  # down is half gate/up's size: packed along with it
            self.packed_down = pack_weight(down.permute(1, 0, 2).reshape(H, -1), min_bytes=0)

    def _expert_rows(self, e: int, two_i: int, hidden: int) -> BlockedWeight:
        """Expert e's gate/up in the kernel's layout: a view of the side-by-side copy where its
        rows fill whole blocks, else a copy of its own."""
        rb = cpu_kernels.ROWS_PER_BLOCK
        if two_i % rb:
            return cpu_kernels.BlockedWeight.of(self.experts_gate_up[e].detach())
        data = self.blocked_gate_up.data[e * two_i // rb:(e + 1) * two_i // rb]
        return cpu_kernels.BlockedWeight(data, two_i, hidden)

    def forward(self, x: torch.Tensor, batch: ForwardBatch | None = None,
                capture: PassCapture | None = None) -> torch.Tensor:
        experts, weights = self.route(x)
        weights = weights.to(x.dtype)
        out = self.routed(x, experts, weights, batch)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        if capture is not None:  # a full trace: converted after the pass (engine/trace/capture.py)
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
            if self.blocked_experts is not None:
                gate_up, down = self.blocked_experts[e]
                gate, up = cpu_kernels.linear(x, gate_up).chunk(2, dim=-1)
                y = cpu_kernels.linear(F.silu(gate).mul_(up), down).mul_(w)
            else:
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
        read either way; one call per expert would cost more than the extra math (on this
        project's CPU, the embedded model: 2 tokens 300 us per layer this way, 480 us by the loop)."""
        T = x.shape[0]
        route = torch.zeros(T, self.num_experts, dtype=x.dtype, device=x.device)
        route.scatter_(1, experts, weights)  # [T, E]: routing weight, 0 where not chosen
        if self.blocked_gate_up is not None or self.packed_gate_up is not None:
            # all experts side by side: [T, H] -> [T, E x 2I] -> [T, E x I] -> [T, H]; each expert's
            # activations scaled by its routing weight, so the second matmul sums them
            if self.blocked_gate_up is not None:  # the C kernel
                first, second = partial(cpu_kernels.linear, w=self.blocked_gate_up), \
                    partial(cpu_kernels.linear, w=self.blocked_down)
            else:  # oneDNN
                first, second = partial(packed_linear, packed=self.packed_gate_up), \
                    partial(packed_linear, packed=self.packed_down)
            gate, up = first(x).view(T, self.num_experts, -1).chunk(2, dim=-1)
            return second((F.silu(gate) * up * route[:, :, None]).view(T, -1))
        gate, up = torch.matmul(x, self.experts_gate_up.transpose(1, 2)).chunk(2, dim=-1)  # [E, T, I]
        y = torch.matmul(F.silu(gate) * up, self.experts_down.transpose(1, 2))  # [E, T, H]
        return torch.einsum("te,eth->th", route, y)
