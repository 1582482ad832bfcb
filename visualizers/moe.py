"""Stage 5b: mixture of experts: the router's top-k experts and weights for every token,
per layer, and how the load spreads over the experts."""
from __future__ import annotations

from typing import Sequence

from visualizers._html import bar, empty, esc, rgb_css, show_piece
from visualizers.selection import Selection, header_html, plural

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


def _panel(body: str, selection: Selection | None = None, frozen: str = "") -> str:
    return '<div class="tt-panel">' + header_html("Mixture of experts", selection, frozen) + body + "</div>"


def shown_rows(positions: list[int], picked: int | None, limit: int = MAX_ROWS) -> list[int]:
    """The newest `limit` positions, or the `limit` ending at the picked one when it is older."""
    if picked in positions and positions.index(picked) < len(positions) - limit:
        i = positions.index(picked)
        return positions[max(0, i - limit + 1):i + 1]
    return positions[-limit:]


def moe_html(events: Sequence[dict], layer: int | None = None, labels: Sequence[str] = (),
             is_moe: bool = True, selection: Selection | None = None, frozen: str = "") -> str:
    """events: this request's `moe` events; selection: the pass whose row is marked."""
    if not events:
        if not is_moe:  # nothing will come: not a wait
            return _panel(empty("this model has no MoE layers: every layer has one dense FFN, so no router "
                                "picks experts"))
        return _panel(empty("no expert routing yet (capture level 'full' records the router's picks)"), None, frozen)
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
    picked = selection.read if selection is not None else None
    shown = shown_rows(positions, picked)
    for p in shown:
        chosen = dict(picks[p])
        label = show_piece(labels[p]) if p < len(labels) else f"#{p}"
        who = esc(f"position {p} {labels[p]!r}" if p < len(labels) else f"position {p}")
        cells = "".join(
            f'<td class="tt-pick" style="background:{rgb_css(chosen[x])}" title="{who} → expert {x} · router weight '
            f'{chosen[x]:.4f} · layer {layer}">{chosen[x]:.2f}</td>' if x in chosen
            else f'<td title="{who} · expert {x} not picked · layer {layer}"></td>' for x in range(num_experts))
        sel = " class='tt-sel-row'" if p == picked else ""
        rows.append(f"<tr{sel}><th data-pos='{p}'>{'▶ ' if p == picked else ''}{p}</th>"  # a click selects its pass
                    f"<th class='tt-tok' data-pos='{p}'>{label}</th>{cells}</tr>")
    grid = (f'<table class="tt-moe"><thead><tr><th>pos</th><th>token</th>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')
    total = sum(load) or 1
    batch = last.get("batch_load") or []
    load_rows = "".join(
        f"<div class='tt-load'><span>E{x}</span>{bar(c / max(max(load), 1))}<span>{plural(c, 'pick')} "
        f"({c / total:.0%}){f' · batch step: {batch[x]}' if x < len(batch) else ''}</span></div>"
        for x, c in enumerate(load))
    info = (f"<div class='tt-lines'><div>layer <b>{layer}</b> ({len(layers)} MoE layers captured) · "
            f"{num_experts} experts, top-{top_k} per token · {plural(len(positions), 'token')} routed · "
            f"cells: router weight of each chosen expert</div></div>")
    hidden = (f"<div class='tt-note'>showing positions {shown[0]}–{shown[-1]} of {len(positions)} tokens routed"
              "</div>" if len(positions) > len(shown) else "")
    if picked is not None and picked not in picks:
        hidden += f"<div class='tt-note'>position {picked} (the selected pass's input) has no routing captured</div>"
    elif picked is not None:
        hidden += ("<div>the selected pass routed " + selection.token(picked) + " to "
                   + ", ".join(f"expert {x} ({w:.2f})" for x, w in picks[picked]) + f" at layer {esc(layer)}</div>")
    return _panel(info + f'<div class="tt-moe-wrap">{grid}</div>{hidden}'
                  f'<div class="tt-subtitle">expert load (this request, layer {esc(layer)})</div>{load_rows}',
                  selection, frozen)
