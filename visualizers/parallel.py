"""Stage 13 as measured: what each rank of a sharded model holds and what it exchanged.

Input: the engine's `schedule.collective` events (engine/parallel): the placement (rank ->
query heads, KV heads, experts, MLP columns) and, per step, every collective with its
kind, layer, bytes and the milliseconds each rank spent in it. Output: a device x layer
table (what each rank holds in each layer, and the bytes and time of that layer's
all-reduces this step), compute against communication per rank, and the same per-token
arithmetic for a large reference model. Pure: events in, escaped HTML out.
"""
from __future__ import annotations

from typing import Sequence

from visualizers import i18n
from visualizers._html import esc, fmt_bytes, not_recorded, panel, said_html, said_html_n
from visualizers.i18n import N_, gettext, number, percent, size

# Llama-3-70B: 80 layers, hidden 8192, 64 query / 8 KV heads, bf16 (its config.json)
REFERENCE = {"name": "Llama-3-70B", "layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "bytes": 2, "devices": 8}
NOT_BUILT = N_("Pipeline parallelism (consecutive layers on different devices) is not built in this engine; "
               "only tensor and expert parallelism run.")


def step_summary(event: dict) -> dict:
    """One step's collectives, summed: per rank the ms inside the forward pass (the layers'
    all-reduces; the batch broadcast is left out: a worker rank waits in it while rank 0
    samples and schedules between steps), per layer the bytes and ms."""
    cols = event.get("collectives", [])
    n = len(event.get("placement", {}).get("ranks", [])) or max((len(c["ms"]) for c in cols), default=1)
    comm_ms = [sum(c["ms"][r] for c in cols if r < len(c["ms"]) and c.get("layer") is not None) for r in range(n)]
    layers: dict[int, dict] = {}
    for c in cols:
        if c.get("layer") is None:
            continue
        d = layers.setdefault(int(c["layer"]), {"bytes": 0, "ms": [0.0] * n, "count": 0})
        d["bytes"] += int(c["bytes"])
        d["count"] += 1
        for r in range(min(n, len(c["ms"]))):
            d["ms"][r] += c["ms"][r]
    return {"ranks": n, "comm_ms": comm_ms, "forward_ms": 1e3 * float(event.get("forward_seconds", 0.0)),
            "layers": layers, "bytes": sum(int(c["bytes"]) for c in cols), "count": len(cols)}


def reference_html(ref: dict = REFERENCE, lang: str = "en") -> str:
    """Bytes per token per layer for the reference model, from its config: two all-reduces
    of the hidden vector per layer; a ring all-reduce sends 2 (N-1)/N of it from each device."""
    per_layer = 2 * ref["hidden"] * ref["bytes"]
    n = ref["devices"]
    sent = per_layer * 2 * (n - 1) / n
    kv = ref["kv_heads"] // n
    said = said_html_n(lang, "For scale, {name} on {devices} devices: {heads} query heads and {n} KV head per device "
                             "per layer; two all-reduces of {hidden} × {bytes} B per token per layer = {per_layer} "
                             "(each device sends about {sent} of it in a ring), × {layers} layers = {total} per token.",
                       "For scale, {name} on {devices} devices: {heads} query heads and {n} KV heads per device "
                       "per layer; two all-reduces of {hidden} × {bytes} B per token per layer = {per_layer} "
                       "(each device sends about {sent} of it in a ring), × {layers} layers = {total} per token.", kv,
                       name=f"<b>{esc(ref['name'])}</b>", devices=str(n), heads=str(ref["heads"] // n),
                       hidden=number(lang, ref["hidden"]), bytes=str(ref["bytes"]),
                       per_layer=f"<b>{esc(size(lang, per_layer))}</b>", sent=esc(size(lang, int(sent))),
                       layers=str(ref["layers"]), total=f"<b>{esc(size(lang, per_layer * ref['layers']))}</b>")
    return f"<p>{said}</p>"


def _split_hint(sizes: Sequence[int] | None, lang: str = "en") -> str:
    """How this model could be split: sizes are the tensor-parallel sizes the engine accepts
    for it (None: not known, e.g. an older recording)."""
    if sizes is None:
        return said_html(lang, "Start the server with {flag} to split it.",
                         flag="<code>--tensor-parallel-size 2</code>")
    if not sizes:
        return said_html(lang, "This engine cannot split it: no tensor-parallel size divides its KV heads and MLP "
                               "columns (or its q/k normalisation spans all heads); attention is split by KV-head "
                               "groups.")
    return said_html(lang, "Start the server with {flag} to split it (sizes it accepts: {sizes}).",
                     flag=f"<code>--tensor-parallel-size {sizes[0]}</code>", sizes=", ".join(str(n) for n in sizes))


def parallel_panel_html(events: Sequence[dict], num_layers: int | None = None, notes: bool = True,
                        split_sizes: Sequence[int] | None = None, lang: str = "en") -> str:
    """The parallelism panel for a request's `schedule.collective` events (the last step shown).
    notes=False: without the not-built line (a caller that says it itself); split_sizes: the
    tensor-parallel sizes the engine accepts for this model, said when it runs on one device;
    lang: the language of its words."""
    events = [e for e in events if e.get("type", "schedule.collective") == "schedule.collective"]
    not_built = f"<p class='tt-note'>{said_html(lang, NOT_BUILT)}</p>"
    if not events:
        one = said_html(lang, "This model runs on one device: nothing crosses between devices.")
        return (f"<div class='tt-parallel'><p>{one} {_split_hint(split_sizes, lang)}</p>"
                + reference_html(lang=lang) + not_built + "</div>")
    last = events[-1]
    ranks = last.get("placement", {}).get("ranks", [])
    summary = step_summary(last)
    L = num_layers if num_layers is not None else (max(summary["layers"], default=-1) + 1)
    head = "".join(f"<th>L{i}</th>" for i in range(L))
    rows = [_rank_row(r, place, summary, L, lang) for r, place in enumerate(ranks)]
    bars = []
    fwd = summary["forward_ms"]
    for r, ms in enumerate(summary["comm_ms"]):
        share = ms / fwd if fwd > 0 else 0.0
        line = said_html(lang, "rank {rank}: compute {compute} ms · all-reduces {comm} ms ({share})", rank=str(r),
                         compute=f"{max(0.0, fwd - ms):.2f}", comm=f"{ms:.2f}", share=f"<b>{percent(lang, share)}</b>")
        bars.append(f"<div class='tt-par-bar'>{line}<div style='background:#ddd;height:8px'>"
                    f"<div style='background:#c0392b;height:8px;width:{min(100.0, 100 * share):.1f}%'></div></div></div>")
    placement = last.get("placement", {})
    ep, latent = bool(placement.get("expert_parallel")), placement.get("latent")
    what = (gettext(lang, "whole experts per rank (expert parallel), attention and dense MLPs split by tensor "
                          "parallelism") if ep else
            gettext(lang, "attention split by query heads, MLP by columns (tensor parallel)") if latent else
            gettext(lang, "attention split by KV-head groups, MLP by columns (tensor parallel)"))
    if latent:  # DeepSeek's MLA: heads split (said above), the latent kept whole by each rank
        what += gettext(lang, "; every rank computes and keeps the whole latent (multi-head latent attention)")
    tail = reference_html(lang=lang) + (not_built if notes else "")
    said = said_html_n(lang, "{ranks} ranks, {what}. The last of {n} step (step {step}): {count} collectives, {bytes} "
                             "from each rank; per layer, what each rank holds and its all-reduces' bytes and "
                             "milliseconds:",
                       "{ranks} ranks, {what}. The last of {n} steps (step {step}): {count} collectives, {bytes} "
                       "from each rank; per layer, what each rank holds and its all-reduces' bytes and milliseconds:",
                       len(events), ranks=str(len(ranks)), what=esc(what), step=esc(last.get("step", "?")),
                       count=str(summary["count"]), bytes=esc(size(lang, summary["bytes"])))
    return (f"<div class='tt-parallel'><p>{said}</p>"
            f"<table class='tt-par-grid' style='border-collapse:collapse'><tr><th></th>{head}</tr>{''.join(rows)}"
            f"</table>{''.join(bars)}{tail}</div>")


def _rank_row(r: int, place: dict, summary: dict, n_layers: int, lang: str) -> str:
    """One rank's row: in each layer the query heads, KV heads (and experts) it holds, and that
    layer's all-reduces' bytes and milliseconds."""
    cells = []
    experts, rank = gettext(lang, "experts"), gettext(lang, "rank {rank}", rank=r)
    for i in range(n_layers):
        d = summary["layers"].get(i)
        moved = (f"<br><span class='tt-note'>{esc(size(lang, d['bytes']))} · {d['ms'][r]:.2f} ms</span>"
                 if d and r < len(d["ms"]) else "")
        tip = gettext(lang, "rank {rank}, layer {layer}", rank=r, layer=i)
        cells.append(f"<td title='{esc(tip)}' style='border:1px solid #ccc;padding:2px 6px'>"
                     f"q {esc(_span(place.get('heads', [])))}<br>"
                     f"kv {esc(_span(place.get('kv_heads', [])))}"
                     + (f"<br>{esc(experts)} {esc(_span(place['experts']))}" if place.get("experts") else "")
                     + f"{moved}</td>")
    return f"<tr><th>{esc(rank)}</th>{''.join(cells)}</tr>"


def _span(items: Sequence[int]) -> str:
    """[0, 1, 2, 3] -> "0–3"; [5] -> "5"."""
    items = list(items)
    if not items:
        return "–"
    if items == list(range(items[0], items[-1] + 1)) and len(items) > 1:
        return f"{items[0]}–{items[-1]}"
    return ",".join(str(i) for i in items)


def measured_stage_html(events: Sequence[dict], lang: str = i18n.DEFAULT) -> str:
    """Classroom stage 13's opening when the request ran sharded: its own measured numbers."""
    if not events:
        return ""
    ranks = events[0].get("placement", {}).get("ranks", [])
    sums = [step_summary(e) for e in events]
    n = len(ranks) or sums[0]["ranks"]
    comm = [sum(s["comm_ms"][r] for s in sums if r < len(s["comm_ms"])) for r in range(n)]
    fwd = sum(s["forward_ms"] for s in sums)
    moved = sum(s["bytes"] for s in sums)
    count = sum(s["count"] for s in sums)
    placement = events[0].get("placement", {})
    where = i18n.gettext(lang, "; ").join(_rank_holds(r, p, placement, lang) for r, p in enumerate(ranks))
    ms = lambda x: i18n.number(lang, x, 1)  # noqa: E731
    share = i18n.gettext(lang, ", ").join(
        i18n.gettext(lang, "rank {r} {ms} ms ({share})", r=str(r), ms=ms(t), share=i18n.percent(lang, t / fwd))
        if fwd > 0 else i18n.gettext(lang, "rank {r} {ms} ms", r=str(r), ms=ms(t)) for r, t in enumerate(comm))
    return "<p>" + said_html(
        lang, "This request {sharded} over {n} ranks ({where}). Over its {steps} steps they ran {count} collectives "
              "and each rank sent {bytes} into them; of {forward} of forward passes, the all-reduces took {share} "
              "(time in a collective includes waiting for the slower rank).",
        sharded="<b>" + said_html(lang, "ran sharded") + "</b>", n=f"<b>{n}</b>", where=esc(where),
        steps=str(len(events)), count=f"<b>{i18n.number(lang, count)}</b>", bytes=f"<b>{esc(fmt_bytes(moved))}</b>",
        forward=f"<b>{ms(fwd)} ms</b>", share=esc(share)) + "</p>"


def _rank_holds(r: int, p: dict, placement: dict, lang: str) -> str:
    """"rank 0: query heads 0–1, KV heads 0, experts 0–3"."""
    heads = (i18n.gettext(lang, "the whole latent") if placement.get("latent") else
             i18n.gettext(lang, "KV heads {span}", span=_span(p.get("kv_heads", []))))
    experts = i18n.gettext(lang, ", experts {span}", span=_span(p["experts"])) \
        if p.get("experts") and placement.get("expert_parallel") else ""
    return i18n.gettext(lang, "rank {r}: query heads {span}, {heads}{experts}", r=str(r),
                        span=_span(p.get("heads", [])), heads=heads, experts=experts)


def parallel_html(events: Sequence[dict], model: dict, level: str = "full", idle: bool = False,
                  lang: str = "en") -> str:
    """The page's parallelism panel: this request's collectives on a sharded engine, or
    what one device means (with the reference model's numbers either way)."""
    tp = int(model.get("tensor_parallel_size") or 1)
    title = gettext(lang, "Parallelism")
    if events:
        return panel(title, parallel_panel_html(events, model.get("num_layers"), lang=lang))
    if tp > 1:
        why = (gettext(lang, "no request yet: each step's collectives show here") if idle else
               gettext(lang, "not recorded: the collectives need capture level basic or full (this request: off)")
               if level == "off" else gettext(lang, "no engine step of this request yet"))
        return not_recorded(title, gettext(lang, "this model runs sharded over {tp} ranks; {why}", tp=tp, why=why))
    return panel(title, parallel_panel_html([], split_sizes=model.get("split_sizes"), lang=lang))
