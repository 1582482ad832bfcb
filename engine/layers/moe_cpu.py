"""A SparseMoE's experts in the CPU's C kernels (engine/kernels/cpu_moe.c): routing and every
chosen expert in one call, the experts' weights blocked one after another (their only copy).

At batch 1 on the embedded MoE the matrices are a few microseconds each; the PyTorch glue
around them (the router's softmax and top-k, reading the choice back, per expert two
linears, SiLU, a product, a scale, an add) was most of the layer's time. Here it is one
ctypes call a layer, routing included where the block's router is the plain softmax one.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from engine.kernels import cpu as cpu_kernels
from engine.kernels.cpu import BlockedWeight

_P, _L = ctypes.c_void_p, ctypes.c_long
KINDS = {torch.float32: 0, torch.bfloat16: 3, torch.float16: 4}  # cpu_layer.c's kinds


class MoEArgs(ctypes.Structure):
    """cpu_moe.c's tt_moe, field for field."""
    _fields_ = [("hidden", _L), ("inter", _L), ("experts", _L), ("top_k", _L), ("norm_topk", _L), ("kind", _L),
                ("router", _P), ("router_kind", _L), ("gate_up", _P), ("down", _P),
                ("gate_up_stride", _L), ("down_stride", _L)]


@dataclass
class CpuExperts:
    """Every expert's gate/up [2I, H] and down [H, I], blocked, one expert after another."""
    gate_up: list[BlockedWeight]
    down: list[BlockedWeight]
    args: MoEArgs

    @classmethod
    def of(cls, gate_up: torch.Tensor, down: torch.Tensor, top_k: int, norm_topk: bool,
           dtype: torch.dtype) -> "CpuExperts":
        """gate_up [E, 2I, H], down [E, H, I] (any float dtype), stored as `dtype`."""
        E, two_i, H = gate_up.shape
        gu, dn = cpu_kernels.blocked_stack(gate_up, dtype), cpu_kernels.blocked_stack(down, dtype)
        stride = lambda ws: ws[1].data.data_ptr() - ws[0].data.data_ptr() if E > 1 else 0  # noqa: E731
        args = MoEArgs(hidden=H, inter=two_i // 2, experts=E, top_k=top_k, norm_topk=int(norm_topk),
                       kind=KINDS[dtype], gate_up=gu[0].data.data_ptr(), down=dn[0].data.data_ptr(),
                       gate_up_stride=stride(gu), down_stride=stride(dn))
        return cls(gu, dn, args)

    def blocked_weights(self) -> list[BlockedWeight]:
        return self.gate_up + self.down

    def unblocked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The experts' weights read back as float32: gate_up [E, 2I, H], down [E, H, I]."""
        return (torch.stack([w.unblocked().float() for w in self.gate_up]),
                torch.stack([w.unblocked().float() for w in self.down]))

    def forward(self, x: torch.Tensor, router: BlockedWeight | None = None, experts: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, H] float32 -> (the weighted sum of each row's experts [T, H], experts [T, k]
        int64, weights [T, k] float32): routed here by `router` (the block's softmax router,
        its blocked weight), or as `experts` / `weights` say."""
        a = self.args
        x = x.contiguous() if x.dtype == torch.float32 else x.float().contiguous()
        T = x.shape[0]
        if router is not None:
            a.router, a.router_kind = router.data.data_ptr(), KINDS[router.dtype]
            experts = torch.empty(T, a.top_k, dtype=torch.long)
            weights = torch.empty(T, a.top_k, dtype=torch.float32)
        else:
            experts = experts.to(torch.long).contiguous()
            weights = weights.to(torch.float32).contiguous()
        out = torch.empty(T, a.hidden, dtype=torch.float32)
        rc = cpu_kernels.library().tt_moe_forward(ctypes.byref(a), x.data_ptr(), T, experts.data_ptr(),
                                                  weights.data_ptr(), int(router is not None), out.data_ptr(),
                                                  torch.get_num_threads())
        if rc:
            raise MemoryError(f"cpu_moe: no memory for the scratch rows of {T} tokens")
        return out, experts, weights
