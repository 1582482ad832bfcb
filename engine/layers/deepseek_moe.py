"""DeepSeek's mixture of experts (V2 and V3), as transformers' DeepseekV2Moe / DeepseekV3MoE.

Beside the routed experts, shared experts that every token passes through (one MLP of
n_shared_experts x moe_intermediate_size). Routing:
- V2: softmax scores; "greedy" top-k, or "group_limited_greedy": the experts fall into
  n_group groups, a group's score is its best expert's, and only the topk_group best groups
  may be chosen from.
- V3 ("noaux_tc"): sigmoid scores; a learned correction bias is added to the scores to
  choose (groups: the sum of each group's two best biased scores; then the experts), while
  the weights are the unbiased scores of the chosen ones, renormalised (norm_topk_prob).
Both multiply the weights by routed_scaling_factor. The expert math is SparseMoE's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.batch import ForwardBatch
from engine.config import ModelConfig
from engine.layers.mlp import MLP, SparseMoE
from engine.trace.capture import PassCapture


class Router(nn.Module):
    """The gate: its weight, and V3's e_score_correction_bias (checkpoint names). Both stay
    float32 in a bfloat16 model, as transformers keeps them (_keep_in_fp32_modules_strict):
    the routing is chosen from small differences between scores."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size))
        if cfg.deepseek_moe.correction_bias:
            self.e_score_correction_bias = nn.Parameter(torch.empty(cfg.num_experts))

    def _apply(self, fn, recurse: bool = True):  # .to(dtype) / to_empty: moved, never narrowed
        super()._apply(fn, recurse)
        for p in self.parameters(recurse=False):
            if p.dtype != torch.float32:
                p.data = p.data.float()
        return self


def best_groups(choice: torch.Tensor, n_group: int, topk_group: int, per_group_top: int) -> torch.Tensor:
    """[T, topk_group]: each token's best groups. A group's score is the sum of its
    `per_group_top` best choice scores (V2: its best one, V3: its best two)."""
    T, E = choice.shape
    score = choice.view(T, n_group, E // n_group).topk(per_group_top, dim=-1)[0].sum(dim=-1)  # [T, n_group]
    return score.topk(topk_group, dim=-1)[1]


def group_mask(groups: torch.Tensor, n_group: int, num_experts: int) -> torch.Tensor:
    """[T, E] bool: the experts in each token's kept groups (groups: best_groups's)."""
    T = groups.shape[0]
    keep = torch.zeros(T, n_group, dtype=torch.bool, device=groups.device).scatter_(1, groups, True)
    return keep[:, :, None].expand(T, n_group, num_experts // n_group).reshape(T, num_experts)


class DeepseekMoE(SparseMoE):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        m = cfg.deepseek_moe
        self.spec = m
        self.gate = Router(cfg)
        self.shared_experts = MLP(cfg.hidden_size, cfg.moe_intermediate_size * m.n_shared_experts) \
            if m.n_shared_experts else None

    def route(self, x: torch.Tensor, detail: dict[str, torch.Tensor] | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (experts [T, top_k], weights [T, top_k]). detail: if given, filled with what a
        trace shows of the choice (scores before / after the bias, the groups kept)."""
        m, E = self.spec, self.gate.weight.shape[0]
        logits = F.linear(x.float(), self.gate.weight.float())
        if m.scoring == "sigmoid":
            scores = logits.sigmoid()
        else:
            scores = logits.softmax(dim=-1, dtype=torch.float32)
        groups = None
        if m.topk_method == "noaux_tc":
            choice = scores + self.gate.e_score_correction_bias.float()
            groups = best_groups(choice, m.n_group, m.topk_group, 2)
            allowed = group_mask(groups, m.n_group, E)
            experts = choice.masked_fill(~allowed, float("-inf")).topk(self.top_k, dim=-1, sorted=False)[1]
            weights = scores.gather(1, experts)
            if detail is not None:
                detail["biased"] = choice.gather(1, experts)
                detail["without_bias"] = self._unbiased_pick(scores)
        elif m.topk_method == "group_limited_greedy":
            groups = best_groups(scores, m.n_group, m.topk_group, 1)
            allowed = group_mask(groups, m.n_group, E)
            weights, experts = scores.masked_fill(~allowed, 0.0).topk(self.top_k, dim=-1, sorted=False)
        else:
            weights, experts = scores.topk(self.top_k, dim=-1, sorted=False)
        if detail is not None:
            detail["scores"] = weights.clone()  # the chosen experts' scores, before any renormalisation
            if groups is not None and m.n_group > 1:
                detail["groups"] = groups.sort(dim=-1)[0]
        # V3 renormalises when norm_topk_prob says so; DeepSeek-V2's own code only for top_k > 1
        if self.norm_topk_prob and (m.topk_method == "noaux_tc" or self.top_k > 1):
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return experts, weights * m.routed_scaling_factor

    def _unbiased_pick(self, scores: torch.Tensor) -> torch.Tensor:
        """The experts V3's rule would pick without the balance bias (for the trace: what the
        bias changed). [T, top_k], sorted."""
        m = self.spec
        allowed = group_mask(best_groups(scores, m.n_group, m.topk_group, 2), m.n_group, scores.shape[1])
        return scores.masked_fill(~allowed, float("-inf")).topk(self.top_k, dim=-1)[1].sort(dim=-1)[0]

    def forward(self, x: torch.Tensor, batch: ForwardBatch | None = None,
                capture: PassCapture | None = None) -> torch.Tensor:
        detail = {} if capture is not None else None
        experts, weights = self.route(x, detail)
        out = self.routed(x, experts, weights.to(x.dtype), batch)
        if self.shared_experts is not None:  # every token, beside its routed experts
            out = out + self.shared_experts(x)
        if capture is not None:  # a full trace: converted after the pass (PassCapture)
            capture.moe_routing[self.layer_idx] = (experts, weights.to(x.dtype))
            capture.moe_detail[self.layer_idx] = detail
        return out
