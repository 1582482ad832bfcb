"""Stage 5b: mixture of experts: the router's top-k experts and weights for every token,
per layer, and how the load spreads over the experts. DeepSeek's MoE adds to the same
panel: the shared experts every token passes through (a column apart), the expert groups
each token may choose from (the others greyed), and the router's scores before and after
V3's balance bias, with the picks the bias changed."""
from __future__ import annotations

from typing import Sequence

from visualizers._html import bar, empty, esc, rgb_css, show_piece
from visualizers.selection import Selection, header_html, plural

MAX_ROWS = 40  # newest token positions shown


def moe_layers(events: Sequence[dict]) -> list[int]:
    return sorted({e["layer"] for e in events})


def moe_details(events: Sequence[dict], layer: int) -> dict[int, dict]:
    """position -> DeepSeek's routing detail at one layer: picked (sorted), scores (before the
    bias), biased, without_bias, groups (whichever the event has)."""
    out: dict[int, dict] = {}
    for e in events:
        if e["layer"] != layer or "deepseek" not in e:
            continue
        for i in range(len(e["experts"])):
            out[e["start"] + i] = {"picked": sorted(e["experts"][i]),
                                   **{k: e[k][i] for k in ("scores", "biased", "without_bias", "groups") if k in e}}
    return out


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
    ds = last.get("deepseek")
    details = moe_details(events, layer) if ds else {}
    head = _head(num_experts, ds)
    rows = []
    picked = selection.read if selection is not None else None
    shown = shown_rows(positions, picked)
    for p in shown:
        label = show_piece(labels[p]) if p < len(labels) else f"#{p}"
        who = esc(f"position {p} {labels[p]!r}" if p < len(labels) else f"position {p}")
        cells = _cells(dict(picks[p]), details.get(p, {}), num_experts, ds, who, layer)
        sel = " class='tt-sel-row'" if p == picked else ""
        rows.append(f"<tr{sel}><th data-pos='{p}'>{'▶ ' if p == picked else ''}{p}</th>"  # a click selects its pass
                    f"<th class='tt-tok' data-pos='{p}'>{label}</th>{cells}</tr>")
    grid = f'<table class="tt-moe"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'
    total = sum(load) or 1
    batch = last.get("batch_load") or []
    load_rows = "".join(
        f"<div class='tt-load'><span>E{x}</span>{bar(c / max(max(load), 1))}<span>{plural(c, 'pick')} "
        f"({c / total:.0%}){f' · batch step: {batch[x]}' if x < len(batch) else ''}</span></div>"
        for x, c in enumerate(load))
    info = (f"<div class='tt-lines'><div>layer <b>{layer}</b> ({len(layers)} MoE layers captured) · "
            f"{num_experts} experts, top-{top_k} per token · {plural(len(positions), 'token')} routed · "
            f"cells: router weight of each chosen expert</div>{_rules(ds, num_experts, top_k, details)}</div>")
    hidden = (f"<div class='tt-note'>showing positions {shown[0]}–{shown[-1]} of {len(positions)} tokens routed"
              "</div>" if len(positions) > len(shown) else "")
    if picked is not None and picked not in picks:
        hidden += f"<div class='tt-note'>position {picked} (the selected pass's input) has no routing captured</div>"
    elif picked is not None:
        hidden += ("<div>the selected pass routed " + selection.token(picked) + " to "
                   + ", ".join(f"expert {x} ({w:.2f})" for x, w in picks[picked]) + f" at layer {esc(layer)}</div>"
                   + _picked_detail(picks[picked], details.get(picked), ds))
    return _panel(info + f'<div class="tt-moe-wrap">{grid}</div>{hidden}'
                  f'<div class="tt-subtitle">expert load (this request, layer {esc(layer)})</div>{load_rows}',
                  selection, frozen)


# --- DeepSeek MoE ----------------------------------------------------------------------

_OFF = "background:repeating-linear-gradient(45deg,#eee 0 3px,#fff 3px 6px)"  # an expert its group rules out


def _head(num_experts: int, ds: dict | None) -> str:
    """The header rows: pos, token, (shared,) E0..; a row of group spans above them when the
    experts fall into groups."""
    experts = "".join(f"<th>E{x}</th>" for x in range(num_experts))
    shared = "<th title='shared experts: every token passes through them, no router'>shared</th>" \
        if ds and ds["shared_experts"] else ""
    row = f"<tr><th>pos</th><th>token</th>{shared}{experts}</tr>"
    if not ds or ds["n_group"] <= 1:
        return row
    size = num_experts // ds["n_group"]
    spans = "".join(f"<th colspan='{size}' class='tt-moe-group'>group {g}</th>" for g in range(ds["n_group"]))
    return f"<tr><th></th><th></th>{'<th></th>' if shared else ''}{spans}</tr>" + row


def _cells(chosen: dict[int, float], detail: dict, num_experts: int, ds: dict | None, who: str, layer: int) -> str:
    """One token's row of cells: the shared column, then each expert: its weight where chosen
    (with its score before / after the bias), hatched where its group was not kept."""
    out = []
    if ds and ds["shared_experts"]:
        shared = plural(ds["shared_experts"], "shared expert")
        out.append(f"<td class='tt-moe-shared' title='{who} · passes through the {shared} (every token, not routed)"
                   f" · layer {layer}'>all</td>")
    groups = detail.get("groups")
    size = num_experts // ds["n_group"] if ds and ds["n_group"] > 1 else num_experts
    for x in range(num_experts):
        if x in chosen:
            score = ""
            if "scores" in detail and len(detail["scores"]) == len(chosen):
                i = _index(chosen, x)
                score = f" · score {detail['scores'][i]:.4f}"
                if "biased" in detail:
                    score += f" before the bias, {detail['biased'][i]:.4f} after"
            shade = chosen[x] / (ds["routed_scaling_factor"] if ds else 1.0)  # weights × the factor: colour in [0, 1]
            out.append(f'<td class="tt-pick" style="background:{rgb_css(shade)}" title="{who} → expert {x} · '
                       f'router weight {chosen[x]:.4f}{score} · layer {layer}">{chosen[x]:.2f}</td>')
        elif groups is not None and x // size not in groups:
            out.append(f'<td style="{_OFF}" title="{who} · expert {x}: group {x // size} not kept for this token, '
                       f'the router could not pick it · layer {layer}"></td>')
        else:
            out.append(f'<td title="{who} · expert {x} not picked · layer {layer}"></td>')
    return "".join(out)


def _index(chosen: dict[int, float], x: int) -> int:
    """Where expert x is in the event's pick order (dicts keep it: zip(experts, weights))."""
    return list(chosen).index(x)


def _rules(ds: dict | None, num_experts: int, top_k: int, details: dict[int, dict]) -> str:
    """The routing's rules in words, and how often the bias changed a pick at this layer."""
    if not ds:
        return ""
    lines = []
    if ds["shared_experts"]:
        lines.append(f"{plural(ds['shared_experts'], 'shared expert')} every token passes through, beside the "
                     f"{num_experts} routed ones (column 'shared': not routed, no weight)")
    if ds["n_group"] > 1:
        lines.append(f"group limit: the experts fall into {ds['n_group']} groups of {num_experts // ds['n_group']}; "
                     f"each token's top-{top_k} come only from its {ds['topk_group']} best groups (hatched: ruled out)")
    if ds["correction_bias"]:
        changed = sum(d["without_bias"] != d["picked"] for d in details.values() if "without_bias" in d)
        lines.append(f"{ds['scoring']} scores; a balance bias (e_score_correction_bias) is added to choose the "
                     f"experts, the unbiased scores weigh them (renormalised, × {ds['routed_scaling_factor']:g})"
                     + (f" · the bias changed the picks of {changed} of {plural(len(details), 'token')} here"
                        if changed else ""))
    else:
        lines.append(f"{ds['scoring']} scores choose and weigh the experts (× {ds['routed_scaling_factor']:g})")
    return "".join(f"<div>{esc(line)}</div>" for line in lines)


def _picked_detail(picks: list[tuple[int, float]], detail: dict | None, ds: dict | None) -> str:
    """The selected token's groups, scores before → after the bias, and what the bias changed."""
    if not ds or not detail:
        return ""
    parts = []
    if "groups" in detail:
        parts.append(f"groups kept: {', '.join(map(str, detail['groups']))} (of {ds['n_group']})")
    if "biased" in detail and "scores" in detail:
        parts.append("scores before → after the bias: " + ", ".join(
            f"expert {x}: {s:.3f} → {b:.3f}" for (x, _), s, b in zip(picks, detail["scores"], detail["biased"])))
    if "without_bias" in detail:
        mine = sorted(x for x, _ in picks)
        if detail["without_bias"] == mine:
            parts.append("without the bias the router would have picked the same experts")
        else:
            gone = [x for x in detail["without_bias"] if x not in mine]
            new = [x for x in mine if x not in detail["without_bias"]]
            parts.append(f"without the bias the router would have picked experts "
                         f"{', '.join(map(str, detail['without_bias']))}: the bias swapped "
                         f"{', '.join(map(str, gone))} for {', '.join(map(str, new))}")
    elif "scores" in detail:
        parts.append("scores: " + ", ".join(f"expert {x}: {s:.3f}" for (x, _), s in zip(picks, detail["scores"])))
    return "".join(f"<div>{esc(p)}</div>" for p in parts)
