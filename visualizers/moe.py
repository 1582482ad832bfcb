"""Stage 5b: mixture of experts: the router's top-k experts and weights for every token,
per layer, and how the load spreads over the experts."""
from __future__ import annotations

from typing import Sequence

from visualizers._html import bar, empty, esc, panel, rgb_css, show_piece

MAX_ROWS = 40  # newest token positions shown


def moe_layers(events: Sequence[dict]) -> list[int]:
    return sorted({e["layer"] for e in events})


def moe_picks(events: Sequence[dict], layer: int) -> dict[int, list[tuple[int, float]]]:
    """position -> [(expert, weight), ...] for one layer (later steps overwrite recomputed ones)."""
    picks: dict[int, list[tuple[int, float]]] = {}
    for e in events:
        if e["layer"] != layer:
            continue
        for i, (ex, w) in enumerate(zip(e["experts"], e["weights"])):
            picks[e["start"] + i] = list(zip(ex, w))
    return picks


def moe_html(events: Sequence[dict], layer: int | None = None, labels: Sequence[str] = (),
             is_moe: bool = True) -> str:
    if not events:
        note = "capture level 'full' records the router's picks" if is_moe else "this model has no MoE layers"
        return panel("Mixture of experts", empty(f"no expert routing yet ({note})"))
    layers = moe_layers(events)
    layer = layer if layer in layers else layers[0]
    last = next(e for e in reversed(events) if e["layer"] == layer)
    num_experts, top_k = last["num_experts"], last["top_k"]
    picks = moe_picks(events, layer)
    positions = sorted(picks)
    load = [0] * num_experts
    for p in positions:
        for ex, _ in picks[p]:
            load[ex] += 1
    head = "".join(f"<th>E{x}</th>" for x in range(num_experts))
    rows = []
    for p in positions[-MAX_ROWS:]:
        chosen = dict(picks[p])
        label = show_piece(labels[p]) if p < len(labels) else f"#{p}"
        who = esc(f"position {p} {labels[p]!r}" if p < len(labels) else f"position {p}")
        cells = "".join(
            f'<td class="tt-pick" style="background:{rgb_css(chosen[x])}" title="{who} → expert {x} · router weight '
            f'{chosen[x]:.4f} · layer {layer}">{chosen[x]:.2f}</td>' if x in chosen
            else f'<td title="{who} · expert {x} not picked · layer {layer}"></td>' for x in range(num_experts))
        rows.append(f"<tr><th>{p}</th><th class='tt-tok'>{label}</th>{cells}</tr>")
    grid = (f'<table class="tt-moe"><thead><tr><th>pos</th><th>token</th>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')
    total = sum(load) or 1
    batch = last.get("batch_load") or []
    load_rows = "".join(
        f"<div class='tt-load'><span>E{x}</span>{bar(c / max(max(load), 1))}<span>{c} picks "
        f"({c / total:.0%}){f' · batch step: {batch[x]}' if x < len(batch) else ''}</span></div>"
        for x, c in enumerate(load))
    info = (f"<div class='tt-lines'><div>layer <b>{layer}</b> ({len(layers)} MoE layers captured) · "
            f"{num_experts} experts, top-{top_k} per token · {len(positions)} tokens routed · "
            f"cells: router weight of each chosen expert</div></div>")
    hidden = f"<div class='tt-note'>showing the newest {MAX_ROWS} of {len(positions)} tokens</div>" \
        if len(positions) > MAX_ROWS else ""
    return panel("Mixture of experts", info + f'<div class="tt-moe-wrap">{grid}</div>{hidden}'
                 f'<div class="tt-subtitle">expert load (this request, layer {esc(layer)})</div>{load_rows}')
