"""Stage 5b: mixture of experts: the router's top-k experts and weights for every token,
per layer, and how the load spreads over the experts. DeepSeek's MoE adds to the same
panel: the shared experts every token passes through (a column apart), the expert groups
each token may choose from (the others greyed), and the router's scores before and after
V3's balance bias, with the picks the bias changed."""
from __future__ import annotations

from typing import Sequence

from visualizers._html import bar, empty, esc, rgb_css, said_html, said_html_n, show_piece
from visualizers.i18n import gettext, ngettext, number, percent
from visualizers.selection import Selection, header_html

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


def _panel(body: str, selection: Selection | None = None, frozen: str = "", lang: str = "en") -> str:
    return '<div class="tt-panel">' + header_html(gettext(lang, "Mixture of experts"), selection, frozen) + body + "</div>"


def shown_rows(positions: list[int], picked: int | None, limit: int = MAX_ROWS) -> list[int]:
    """The newest `limit` positions, or the `limit` ending at the picked one when it is older."""
    if picked in positions and positions.index(picked) < len(positions) - limit:
        i = positions.index(picked)
        return positions[max(0, i - limit + 1):i + 1]
    return positions[-limit:]


def moe_html(events: Sequence[dict], layer: int | None = None, labels: Sequence[str] = (),
             is_moe: bool = True, selection: Selection | None = None, frozen: str = "", lang: str = "en") -> str:
    """events: this request's `moe` events; selection: the pass whose row is marked; lang: the
    language of its words."""
    if not events:
        if not is_moe:  # nothing will come: not a wait
            return _panel(empty(gettext(lang, "this model has no MoE layers: every layer has one dense FFN, so no "
                                              "router picks experts")), lang=lang)
        return _panel(empty(gettext(lang, "no expert routing yet (capture level 'full' records the router's picks)")),
                      None, frozen, lang)
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
    head = _head(num_experts, ds, lang)
    rows = []
    picked = selection.read if selection is not None else None
    shown = shown_rows(positions, picked)
    for p in shown:
        label = show_piece(labels[p]) if p < len(labels) else f"#{p}"
        who = gettext(lang, "position {position}", position=p) + (f" {labels[p]!r}" if p < len(labels) else "")
        cells = _cells(dict(picks[p]), details.get(p, {}), num_experts, ds, who, (layer, lang))
        sel = " class='tt-sel-row'" if p == picked else ""
        rows.append(f"<tr{sel}><th data-pos='{p}'>{'▶ ' if p == picked else ''}{p}</th>"  # a click selects its pass
                    f"<th class='tt-tok' data-pos='{p}'>{label}</th>{cells}</tr>")
    grid = f'<table class="tt-moe"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'
    info = said_html(lang, "layer {layer} ({layers} MoE layers captured) · {experts} experts, top-{k} per token · "
                           "{routed} routed · cells: router weight of each chosen expert", layer=f"<b>{layer}</b>",
                     layers=str(len(layers)), experts=str(num_experts), k=str(top_k),
                     routed=said_html_n(lang, "{n} token", "{n} tokens", len(positions)))
    info = f"<div class='tt-lines'><div>{info}</div>{_rules(ds, num_experts, top_k, details, lang)}</div>"
    hidden = ("<div class='tt-note'>" + said_html(lang, "showing positions {first}–{last} of {n} tokens routed",
                                                  first=str(shown[0]), last=str(shown[-1]), n=str(len(positions)))
              + "</div>" if len(positions) > len(shown) else "")
    if picked is not None and picked not in picks:
        hidden += "<div class='tt-note'>" + said_html(lang, "position {position} (the selected pass's input) has no "
                                                            "routing captured", position=str(picked)) + "</div>"
    elif picked is not None:
        to = ", ".join(gettext(lang, "expert {x} ({w})", x=x, w=f"{w:.2f}") for x, w in picks[picked])
        hidden += ("<div>" + said_html(lang, "the selected pass routed {token} to {experts} at layer {layer}",
                                       token=selection.token(picked), experts=esc(to), layer=esc(layer)) + "</div>"
                   + _picked_detail(picks[picked], details.get(picked), ds, lang))
    load_title = said_html(lang, "expert load (this request, layer {layer})", layer=esc(layer))
    return _panel(info + f'<div class="tt-moe-wrap">{grid}</div>{hidden}'
                  f'<div class="tt-subtitle">{load_title}</div>{_load_rows(load, last, lang)}', selection, frozen, lang)


def _load_rows(load: list[int], last: dict, lang: str) -> str:
    """How many picks each expert got in this request (and in the last step's whole batch)."""
    total, batch = sum(load) or 1, last.get("batch_load") or []
    rows = []
    for x, c in enumerate(load):
        step = gettext(lang, " · batch step: {n}", n=batch[x]) if x < len(batch) else ""
        words = ngettext(lang, "{n} pick", "{n} picks", c) + f" ({percent(lang, c / total)}){step}"
        rows.append(f"<div class='tt-load'><span>E{x}</span>{bar(c / max(max(load), 1))}<span>{esc(words)}</span></div>")
    return "".join(rows)


# --- DeepSeek MoE ----------------------------------------------------------------------

_OFF = "background:repeating-linear-gradient(45deg,#eee 0 3px,#fff 3px 6px)"  # an expert its group rules out


def _head(num_experts: int, ds: dict | None, lang: str = "en") -> str:
    """The header rows: pos, token, (shared,) E0..; a row of group spans above them when the
    experts fall into groups."""
    experts = "".join(f"<th>E{x}</th>" for x in range(num_experts))
    tip = esc(gettext(lang, "shared experts: every token passes through them, no router"))
    pos, token, word = gettext(lang, "pos"), gettext(lang, "token"), gettext(lang, "shared")
    shared = f"<th title='{tip}'>{esc(word)}</th>" if ds and ds["shared_experts"] else ""
    row = f"<tr><th>{esc(pos)}</th><th>{esc(token)}</th>{shared}{experts}</tr>"
    if not ds or ds["n_group"] <= 1:
        return row
    size = num_experts // ds["n_group"]
    groups = [gettext(lang, "group {g}", g=g) for g in range(ds["n_group"])]
    spans = "".join(f"<th colspan='{size}' class='tt-moe-group'>{esc(g)}</th>" for g in groups)
    return f"<tr><th></th><th></th>{'<th></th>' if shared else ''}{spans}</tr>" + row


def _cells(chosen: dict[int, float], detail: dict, num_experts: int, ds: dict | None, who: str,
           at: tuple[int, str]) -> str:
    """One token's row of cells: the shared column, then each expert: its weight where chosen
    (with its score before / after the bias), hatched where its group was not kept. who: the
    token in words (text, escaped here); at: (layer, lang)."""
    (layer, lang), out = at, []
    if ds and ds["shared_experts"]:
        shared = ngettext(lang, "{n} shared expert", "{n} shared experts", ds["shared_experts"])
        tip = esc(gettext(lang, "{who} · passes through the {shared} (every token, not routed) · layer {layer}",
                          who=who, shared=shared, layer=layer))
        every = esc(gettext(lang, "all"))
        out.append(f"<td class='tt-moe-shared' title='{tip}'>{every}</td>")
    groups = detail.get("groups")
    size = num_experts // ds["n_group"] if ds and ds["n_group"] > 1 else num_experts
    for x in range(num_experts):
        if x in chosen:
            score = ""
            if "scores" in detail and len(detail["scores"]) == len(chosen):
                i = _index(chosen, x)
                score = (gettext(lang, " · score {before} before the bias, {after} after",
                                 before=f"{detail['scores'][i]:.4f}", after=f"{detail['biased'][i]:.4f}")
                         if "biased" in detail else gettext(lang, " · score {score}", score=f"{detail['scores'][i]:.4f}"))
            shade = chosen[x] / (ds["routed_scaling_factor"] if ds else 1.0)  # weights × the factor: colour in [0, 1]
            tip = gettext(lang, "{who} → expert {x} · router weight {w}{score} · layer {layer}", who=who, x=x,
                          w=f"{chosen[x]:.4f}", score=score, layer=layer)
            out.append(f'<td class="tt-pick" style="background:{rgb_css(shade)}" '
                       f'title="{esc(tip)}">{chosen[x]:.2f}</td>')
        elif groups is not None and x // size not in groups:
            tip = gettext(lang, "{who} · expert {x}: group {g} not kept for this token, the router could not pick it "
                                "· layer {layer}", who=who, x=x, g=x // size, layer=layer)
            out.append(f'<td style="{_OFF}" title="{esc(tip)}"></td>')
        else:
            tip = gettext(lang, "{who} · expert {x} not picked · layer {layer}", who=who, x=x, layer=layer)
            out.append(f'<td title="{esc(tip)}"></td>')
    return "".join(out)


def _index(chosen: dict[int, float], x: int) -> int:
    """Where expert x is in the event's pick order (dicts keep it: zip(experts, weights))."""
    return list(chosen).index(x)


def _rules(ds: dict | None, num_experts: int, top_k: int, details: dict[int, dict], lang: str = "en") -> str:
    """The routing's rules in words, and how often the bias changed a pick at this layer."""
    if not ds:
        return ""
    lines, factor = [], f"{ds['routed_scaling_factor']:g}"
    if ds["shared_experts"]:
        lines.append(ngettext(lang, "{n} shared expert every token passes through, beside the {routed} routed ones "
                                    "(column 'shared': not routed, no weight)",
                              "{n} shared experts every token passes through, beside the {routed} routed ones "
                              "(column 'shared': not routed, no weight)", ds["shared_experts"], routed=num_experts))
    if ds["n_group"] > 1:
        lines.append(gettext(lang, "group limit: the experts fall into {groups} groups of {size}; each token's top-{k} "
                                   "come only from its {best} best groups (hatched: ruled out)", groups=ds["n_group"],
                             size=num_experts // ds["n_group"], k=top_k, best=ds["topk_group"]))
    if ds["correction_bias"]:
        changed = sum(d["without_bias"] != d["picked"] for d in details.values() if "without_bias" in d)
        lines.append(gettext(lang, "{scoring} scores; a balance bias (e_score_correction_bias) is added to choose the "
                                   "experts, the unbiased scores weigh them (renormalised, × {factor})",
                             scoring=ds["scoring"], factor=factor)
                     + (ngettext(lang, " · the bias changed the picks of {changed} of {n} token here",
                                 " · the bias changed the picks of {changed} of {n} tokens here", len(details),
                                 changed=changed) if changed else ""))
    else:
        lines.append(gettext(lang, "{scoring} scores choose and weigh the experts (× {factor})", scoring=ds["scoring"],
                             factor=factor))
    return "".join(f"<div>{esc(line)}</div>" for line in lines)


def _picked_detail(picks: list[tuple[int, float]], detail: dict | None, ds: dict | None, lang: str = "en") -> str:
    """The selected token's groups, scores before → after the bias, and what the bias changed."""
    if not ds or not detail:
        return ""
    parts, ids = [], lambda xs: ", ".join(map(str, xs))  # noqa: E731
    if "groups" in detail:
        parts.append(gettext(lang, "groups kept: {groups} (of {n})", groups=ids(detail["groups"]), n=ds["n_group"]))
    if "biased" in detail and "scores" in detail:
        moved = [gettext(lang, "expert {x}: {before} → {after}", x=x, before=f"{s:.3f}", after=f"{b:.3f}")
                 for (x, _), s, b in zip(picks, detail["scores"], detail["biased"])]
        parts.append(gettext(lang, "scores before → after the bias: {scores}", scores=", ".join(moved)))
    if "without_bias" in detail:
        mine = sorted(x for x, _ in picks)
        if detail["without_bias"] == mine:
            parts.append(gettext(lang, "without the bias the router would have picked the same experts"))
        else:
            gone = [x for x in detail["without_bias"] if x not in mine]
            new = [x for x in mine if x not in detail["without_bias"]]
            parts.append(gettext(lang, "without the bias the router would have picked experts {experts}: the bias "
                                       "swapped {gone} for {new}", experts=ids(detail["without_bias"]), gone=ids(gone),
                                 new=ids(new)))
    elif "scores" in detail:
        scores = [gettext(lang, "expert {x}: {score}", x=x, score=f"{s:.3f}") for (x, _), s in zip(picks, detail["scores"])]
        parts.append(gettext(lang, "scores: {scores}", scores=", ".join(scores)))
    return "".join(f"<div>{esc(p)}</div>" for p in parts)
