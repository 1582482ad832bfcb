"""Attention captures read back as rows: which query positions a layer's events hold, and one
query's weights over its keys, whatever form the capture was stored in (visualizers.compact).

The engine's `attention` event holds every captured layer of one pass of one sequence;
visualizers.compact.per_layer splits it into one per layer: probs [heads, rows, keys] for the
queries q_start .. q_start + rows - 1 over the kept keys (key_positions): the first k_head
positions (the attention sink, the prompt's start), then k_start .. on; the keys between them
(the gap) were never captured. A trace written before `k_head` existed has none: one run from
k_start. A later pass may recompute a row (a speculative verify after a rejection): the newest
event holding a row is the one that counts."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from visualizers.compact import array, is_compact


def key_positions(k_head: int, k_start: int, keys: int) -> np.ndarray:
    """The true positions of a capture's `keys` key columns: 0 .. k_head - 1, then k_start on."""
    head = min(k_head, keys)
    return np.concatenate([np.arange(head), np.arange(k_start, k_start + keys - head)]).astype(int)


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
    k_start: int  # the first captured key after the first k_head; keys k_head .. k_start - 1 were not captured
    weights: np.ndarray  # [keys], at the positions `positions` names
    kind: str  # prefill, decode or verify
    window: int | None  # the layer's sliding window (None: full attention)
    k_head: int = 0  # the first positions kept before the gap (0: one run from k_start)

    @property
    def positions(self) -> np.ndarray:
        """The true position of each weight."""
        return key_positions(self.k_head, self.k_start, len(self.weights))

    @property
    def gap(self) -> tuple[int, int] | None:
        """(first, last + 1) of the keys between the first ones and the recent ones, not captured."""
        return (self.k_head, self.k_start) if 0 < self.k_head < self.k_start else None


@dataclass(slots=True)
class LayerPass:
    """One layer of one pass's attention event (an index into it: nothing copied or decoded)."""
    event: dict
    i: int | None  # the layer's index in the event's "layers" (None: a one-layer event)
    layer: int
    q_start: int
    rows: int
    k_start: int
    kind: str
    heads: list[int]
    window: int | None
    num_heads: int
    num_kv_heads: int
    k_head: int = 0


@dataclass(slots=True)
class _Pass:
    """One attention event as the index keeps it: its query rows and where each layer sits."""
    event: dict
    q_start: int
    rows: int
    slot: dict[int, int | None]  # layer -> its index in the event's "layers" (None: a one-layer event)
    windows: dict[int, int | None]

    def at(self, layer: int) -> LayerPass:
        e = self.event
        return LayerPass(e, self.slot[layer], layer, self.q_start, self.rows, e["k_start"], e["kind"], e["heads"],
                         self.windows[layer], e["num_heads"], e["num_kv_heads"], int(e.get("k_head") or 0))


def _index(e: dict) -> _Pass:
    rows = _shape(e["probs"])[1]
    if "layers" in e:  # the engine's form: every captured layer of the pass in one event
        layers = e["layers"]
        windows = e.get("windows") or [None] * len(layers)
        return _Pass(e, e["q_start"], rows, {layer: i for i, layer in enumerate(layers)}, dict(zip(layers, windows)))
    return _Pass(e, e["q_start"], rows, {e["layer"]: None}, {e["layer"]: e.get("window")})


class LayerIndex:
    """A trace's attention events, cheap to ask for one query row of one layer (the panel asks
    for one row of every layer and head: it must not decode every event of a long answer, nor
    copy an event once per layer)."""

    def __init__(self, events: Sequence[dict]) -> None:
        self.passes = [_index(e) for e in events]
        self._layers: dict[int, list[LayerPass]] = {}
        self._arrays: dict[int, np.ndarray] = {}

    @property
    def layers(self) -> list[int]:
        return sorted({layer for p in self.passes for layer in p.slot})

    @property
    def heads(self) -> list[int]:
        return list(self.passes[0].event["heads"]) if self.passes else []

    def of(self, layer: int) -> list[LayerPass]:
        """This layer's passes, oldest first."""
        if layer not in self._layers:
            self._layers[layer] = [p.at(layer) for p in self.passes if layer in p.slot]
        return self._layers[layer]

    def probs(self, lp: LayerPass) -> np.ndarray:
        """[heads, rows, keys] of one layer of a pass (a view of a compact capture's array)."""
        key = id(lp.event)
        if key not in self._arrays:
            p = lp.event["probs"]  # a list form keeps its exact (rounded) values; a compact one is float32
            self._arrays[key] = array(p) if is_compact(p) or isinstance(p, np.ndarray) else np.asarray(p, dtype=float)
        whole = self._arrays[key]
        return whole if lp.i is None else whole[lp.i]

    def span(self, layer: int) -> tuple[int, int]:
        """(first, last + 1) query positions captured at this layer."""
        ps = [p for p in self.passes if layer in p.slot]
        if not ps:
            return 0, 0
        return min(p.q_start for p in ps), max(p.q_start + p.rows for p in ps)

    def pass_of(self, layer: int, q: int) -> LayerPass | None:
        """The newest pass of this layer holding query row q."""
        for p in reversed(self.passes):
            if layer in p.slot and p.q_start <= q < p.q_start + p.rows:
                return p.at(layer)
        return None

    def row(self, layer: int, head: int, q: int) -> Row | None:
        lp = self.pass_of(layer, q)
        if lp is None or head not in lp.heads:
            return None
        w = np.asarray(self.probs(lp)[lp.heads.index(head)][q - lp.q_start], dtype=float)
        return Row(q, lp.k_start, w, lp.kind, lp.window, lp.k_head)

    def passes_between(self, layer: int, lo: int, hi: int) -> list[LayerPass]:
        """This layer's passes holding any query in lo .. hi - 1, oldest first."""
        return [p.at(layer) for p in self.passes if layer in p.slot and p.q_start < hi and p.q_start + p.rows > lo]
