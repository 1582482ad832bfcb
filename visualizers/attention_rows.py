"""Attention captures read back as rows: which query positions a layer's events hold, and one
query's weights over its keys, whatever form the capture was stored in (visualizers.compact).

The engine's `attention` event holds every captured layer of one pass of one sequence;
visualizers.compact.per_layer splits it into one per layer: probs [heads, rows, keys] for the queries q_start .. q_start + rows - 1 over the keys
k_start .. k_start + keys - 1 (the capture keeps the last `max_keys` of each; older keys were
never captured). A later pass may recompute a row (a speculative verify after a rejection):
the newest event holding a row is the one that counts."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from visualizers.compact import array, is_compact, per_layer


def _shape(probs) -> list[int]:
    """[heads, rows, keys] without decoding a compact capture."""
    if isinstance(probs, dict) and "shape" in probs:
        return list(probs["shape"])[-3:]
    if isinstance(probs, np.ndarray):
        return list(probs.shape)
    return [len(probs), len(probs[0]) if len(probs) else 0, len(probs[0][0]) if len(probs) and len(probs[0]) else 0]


@dataclass
class Row:
    """One query's attention over its captured keys, for one layer and head."""
    q: int  # the query's position (the token the pass read)
    k_start: int  # the first captured key; keys 0 .. k_start - 1 were not captured
    weights: np.ndarray  # [keys]
    kind: str  # prefill, decode or verify
    window: int | None  # the layer's sliding window (None: full attention)


class LayerIndex:
    """A trace's attention events by layer, cheap to ask for one query row (the panel asks for
    one row of every layer and head: it must not decode every event of a long answer)."""

    def __init__(self, events: Sequence[dict]) -> None:
        self.by_layer: dict[int, list[dict]] = {}
        for e in per_layer(events):
            self.by_layer.setdefault(e["layer"], []).append(e)
        self._arrays: dict[int, np.ndarray] = {}

    @property
    def layers(self) -> list[int]:
        return sorted(self.by_layer)

    def probs(self, e: dict) -> np.ndarray:
        """[heads, rows, keys] of one per-layer event (a view of a compact capture's array)."""
        key = id(e)
        if key not in self._arrays:
            p = e["probs"]  # a list form keeps its exact (rounded) values; a compact one is float32
            self._arrays[key] = array(p) if is_compact(p) or isinstance(p, np.ndarray) else np.asarray(p, dtype=float)
        return self._arrays[key]

    def span(self, layer: int) -> tuple[int, int]:
        """(first, last + 1) query positions captured at this layer."""
        evs = self.by_layer.get(layer, [])
        if not evs:
            return 0, 0
        return min(e["q_start"] for e in evs), max(e["q_start"] + _shape(e["probs"])[1] for e in evs)

    def event_of(self, layer: int, q: int) -> dict | None:
        """The newest event of this layer holding query row q."""
        for e in reversed(self.by_layer.get(layer, [])):
            if e["q_start"] <= q < e["q_start"] + _shape(e["probs"])[1]:
                return e
        return None

    def row(self, layer: int, head: int, q: int) -> Row | None:
        e = self.event_of(layer, q)
        if e is None or head not in e["heads"]:
            return None
        w = np.asarray(self.probs(e)[e["heads"].index(head)][q - e["q_start"]], dtype=float)
        return Row(q, e["k_start"], w, e["kind"], e.get("window"))

    def events_between(self, layer: int, lo: int, hi: int) -> list[dict]:
        """This layer's events holding any query in lo .. hi - 1, oldest first."""
        return [e for e in self.by_layer.get(layer, [])
                if e["q_start"] < hi and e["q_start"] + _shape(e["probs"])[1] > lo]
