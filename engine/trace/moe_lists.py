"""A pass's MoE routing for its `moe` events: the tensors the pass wrote, kept as they are
until the first of its events is built, then turned into lists once for every sequence of
the batch (MoeLists).

Turning every layer's routing into lists (`tolist`, the weights rounded in float64, each
layer's expert load) is Python work: at the step it cost the embedded MoE model about as
much as a tenth of its decode step (2026-12-06). A `full` trace builds most of its events
after the request's last token (engine/trace/capture_queue.py), so the step only keeps the
tensors here and each sequence's rows. The tensors are the pass's own: every MoE path
writes its routing into tensors it allocates for that pass (none reuses a buffer across
passes), so they still hold this pass's routing when the events are built later.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

DECIMALS = 4  # as trace.jsonable rounds floats


def rounded(x: torch.Tensor) -> list:
    # rounded in float64: a float32 0.0123 becomes 0.012299999594688416 as a Python float,
    # 18 bytes of JSON instead of 6 (most of a `full` trace is these numbers)
    return torch.round(x.double(), decimals=DECIMALS).tolist()


@dataclass
class MoeLists:
    """One pass's routing: per layer (sorted) its experts and weights [T, top_k] (one [L, T,
    top_k] tensor each where one call wrote every layer's), DeepSeek's detail tensors [T, ...]
    per layer, and the flat rows of each sequence that records its routing."""
    layers: list[int]
    routing: dict[int, tuple[torch.Tensor, torch.Tensor]]  # layer -> (experts, weights)
    stacked: tuple[torch.Tensor, torch.Tensor] | None  # every layer's at once, or None
    detail: dict[int, dict[str, torch.Tensor]]
    slices: dict[int, slice]  # sequence of the batch -> its rows
    num_experts: int
    _lists: dict[int, dict[str, list]] | None = field(default=None, repr=False)  # layer -> the pass's lists
    _load: dict[int, list[int]] = field(default_factory=dict, repr=False)  # layer -> tokens per expert

    @property
    def converted(self) -> bool:
        """Whether the lists are made (an event of the pass was built)."""
        return self._lists is not None

    def seq(self, layer: int, b: int) -> dict[str, list]:
        """Sequence b's routing at `layer`: experts, weights (rounded like trace.jsonable) and
        DeepSeek's detail, as lists, one entry a row."""
        sl = self.slices[b]
        return {k: v[sl] for k, v in self._converted()[layer].items()}

    def load(self, layer: int) -> list[int]:
        """Tokens per expert at `layer`, over the whole batch."""
        self._converted()
        return self._load[layer]

    def as_dict(self) -> dict[int, dict[int, dict[str, list]]]:
        """Every layer's routing of every recorded sequence: layer -> sequence -> seq()."""
        return {layer: {b: self.seq(layer, b) for b in self.slices} for layer in self.layers}

    def _converted(self) -> dict[int, dict[str, list]]:
        """The pass's routing as lists, made once (the first event of the pass asks)."""
        if self._lists is not None:
            return self._lists
        if self.stacked is not None:
            experts, weights = self.stacked
        else:
            experts = torch.stack([self.routing[layer][0] for layer in self.layers])  # [L, T, top_k]
            weights = torch.stack([self.routing[layer][1] for layer in self.layers])
        picks = experts.reshape(experts.shape[0], -1)
        load = torch.zeros(picks.shape[0], self.num_experts, dtype=torch.long, device=picks.device)
        load.scatter_add_(1, picks.long(), torch.ones_like(picks, dtype=torch.long))
        experts_l, weights_l, load_l = experts.tolist(), rounded(weights), load.tolist()
        lists = {}
        for i, layer in enumerate(self.layers):
            self._load[layer] = load_l[i]
            lists[layer] = {"experts": experts_l[i], "weights": weights_l[i]}
            for k, v in self.detail.get(layer, {}).items():  # DeepSeek: the same rows, as lists
                lists[layer][k] = v.tolist() if not v.is_floating_point() else rounded(v)
        self._lists = lists
        return lists
