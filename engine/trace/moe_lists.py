"""A pass's MoE routing for its `moe` events: the tensors the pass wrote, kept as they are
until the first of its events is built, then turned into lists once for every sequence of
the batch (MoeLists).

Turning every layer's routing into lists (`tolist`, the weights rounded in float64, each
layer's expert load) is Python work: at the step it cost the embedded MoE model 0.07 ms a
token of a ~1 ms step (2026-12-06). A `full` trace builds most of its events after the
request's last token (engine/trace/capture_queue.py), so the step only keeps the tensors
here and the batch's query starts (each sequence's rows). The tensors are the pass's own: every MoE path
writes its routing into tensors it allocates for that pass (none reuses a buffer across
passes), so they still hold this pass's routing when the events are built later. A
sequence's `moe` events of a pass (one a layer) wait as one (engine/step_trace.py moe_events).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

DECIMALS = 4  # as trace.jsonable rounds floats


def rounded(x: torch.Tensor) -> list:
    # rounded in float64: a float32 0.0123 becomes 0.012299999594688416 as a Python float,
    # 18 bytes of JSON instead of 6 (most of a `full` trace is these numbers)
    return torch.round(x.double(), decimals=DECIMALS).tolist()


@dataclass(slots=True)
class MoeLists:
    """One pass's routing as the pass wrote it: per layer its experts and weights [T, top_k]
    (also one [L, T, top_k] tensor each where one call wrote every layer's), DeepSeek's detail
    tensors [T, ...] per layer. Only references at the step (Python right after a pass runs
    cold: each call there counts); sorted, stacked and turned into lists when first read."""
    routing: dict[int, tuple[torch.Tensor, torch.Tensor]]  # layer -> (experts, weights)
    stacked: tuple[torch.Tensor, torch.Tensor] | None  # every layer's at once, if one call wrote them
    detail: dict[int, dict[str, torch.Tensor]]
    starts: list[int]  # the batch's query starts: sequence b's rows are starts[b] .. starts[b + 1] - 1
    num_experts: int
    _lists: dict[int, dict[str, list]] | None = None  # layer -> the pass's lists
    _load: dict[int, list[int]] | None = None  # layer -> tokens per expert

    @property
    def layers(self) -> list[int]:  # (every layer, where one call wrote them all and none apart)
        return sorted(self.routing) if self.routing else list(range(self.stacked[0].shape[0]))

    def tensors(self) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        """Each layer's (layer, experts, weights) as the pass wrote them."""
        if self.routing:
            return [(layer, *self.routing[layer]) for layer in self.layers]
        experts, weights = self.stacked
        return [(i, experts[i], weights[i]) for i in range(experts.shape[0])]

    @property
    def converted(self) -> bool:
        """Whether the lists are made (an event of the pass was built)."""
        return self._lists is not None

    def seq(self, layer: int, b: int) -> dict[str, list]:
        """Sequence b's routing at `layer`: experts, weights (rounded like trace.jsonable) and
        DeepSeek's detail, as lists, one entry a row."""
        sl = slice(self.starts[b], self.starts[b + 1])
        return {k: v[sl] for k, v in self._converted()[layer].items()}

    def load(self, layer: int) -> list[int]:
        """Tokens per expert at `layer`, over the whole batch."""
        self._converted()
        return self._load[layer]

    def _converted(self) -> dict[int, dict[str, list]]:
        """The pass's routing as lists, made once (the first event of the pass asks)."""
        if self._lists is not None:
            return self._lists
        layers = self.layers
        if self.stacked is not None and layers == list(range(self.stacked[0].shape[0])):
            experts, weights = self.stacked
        else:
            experts = torch.stack([self.routing[layer][0] for layer in layers])  # [L, T, top_k]
            weights = torch.stack([self.routing[layer][1] for layer in layers])
        picks = experts.reshape(experts.shape[0], -1)
        load = torch.zeros(picks.shape[0], self.num_experts, dtype=torch.long, device=picks.device)
        load.scatter_add_(1, picks.long(), torch.ones_like(picks, dtype=torch.long))
        experts_l, weights_l, load_l = experts.tolist(), rounded(weights), load.tolist()
        lists, self._load = {}, {}
        for i, layer in enumerate(layers):
            self._load[layer] = load_l[i]
            lists[layer] = {"experts": experts_l[i], "weights": weights_l[i]}
            for k, v in self.detail.get(layer, {}).items():  # DeepSeek: the same rows, as lists
                lists[layer][k] = v.tolist() if not v.is_floating_point() else rounded(v)
        self._lists = lists
        return lists
