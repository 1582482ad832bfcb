"""Stages 6 and 11: the request's life on one time axis: queue, tokenize, prefill
chunks, each decode (or verify) step, TTFT, and who else shared each step's batch."""
from __future__ import annotations

from typing import Sequence

from visualizers._html import empty, esc, fmt_ms, panel

WIDTH, LANE, LEFT = 760, 22, 70
KIND_COLOR = {"prefill": "#466ec8", "decode": "#f08c1e", "verify": "#a050c8"}


def timeline_steps(events: Sequence[dict], request_id: str) -> list[dict]:
    """One row per engine step that computed this request: start/end (s), kind, tokens, batch."""
    steps = []
    for e in events:
        if e["type"] != "schedule.step":
            continue
        mine = next((b for b in e["batch"] if b["request_id"] == request_id), None)
        if mine is None:
            continue
        steps.append({"step": e["step"], "start": e["ts"] - e["forward_seconds"], "end": e["ts"],
                      "kind": mine["kind"], "tokens": mine["num_tokens"], "batch_tokens": e["num_tokens"],
                      "others": [b["request_id"] for b in e["batch"] if b["request_id"] != request_id]})
    return steps


def timeline_html(events: Sequence[dict], request_id: str) -> str:
    """events: this request's events plus the schedule.step events that include it."""
    by_type: dict[str, list[dict]] = {}
    for e in events:
        by_type.setdefault(e["type"], []).append(e)
    arrive = (by_type.get("request.arrive") or [None])[0]
    if arrive is None:
        return panel("Timeline", empty("the request has not arrived yet"))
    tok = (by_type.get("tokenize") or [{}])[0]
    t0 = arrive["ts"] - tok.get("seconds", 0.0)
    steps = timeline_steps(events, request_id)
    tokens = by_type.get("token", [])
    finish = (by_type.get("finish") or [None])[0]
    t_end = max([arrive["ts"]] + [s["end"] for s in steps] + [e["ts"] for e in tokens]
                + ([finish["ts"]] if finish else []))
    span = max(t_end - t0, 1e-3)

    def x(t: float) -> float:
        return LEFT + (t - t0) / span * (WIDTH - LEFT - 10)

    lanes = ["tokenize", "queue", "prefill", "decode", "batch", "tokens"]
    y = {name: 8 + i * LANE for i, name in enumerate(lanes)}
    svg = [f'<text x="4" y="{y[n] + 13}" class="tt-lane">{n}</text>' for n in lanes]
    svg.append(f'<rect x="{x(t0):.1f}" y="{y["tokenize"]}" width="{max(1.5, x(arrive["ts"]) - x(t0)):.1f}" '
               f'height="16" fill="#7a7a8c"><title>tokenize {esc(fmt_ms(tok.get("seconds", 0)))}</title></rect>')
    if steps:
        q_end = steps[0]["start"]
        svg.append(f'<rect x="{x(arrive["ts"]):.1f}" y="{y["queue"]}" width="{max(1.5, x(q_end) - x(arrive["ts"])):.1f}"'
                   f' height="16" fill="#b9b9c6"><title>queue {esc(fmt_ms(q_end - arrive["ts"]))}</title></rect>')
    for s in steps:
        lane = "prefill" if s["kind"] == "prefill" else "decode"
        others = ", ".join(s["others"]) or "none"
        title = (f"step {s['step']} · {s['kind']} · {s['tokens']} tokens of {s['batch_tokens']} in the batch · "
                 f"{fmt_ms(s['end'] - s['start'])} · shared with: {others}")
        svg.append(f'<rect x="{x(s["start"]):.1f}" y="{y[lane]}" width="{max(1.5, x(s["end"]) - x(s["start"])):.1f}" '
                   f'height="16" fill="{KIND_COLOR.get(s["kind"], "#888")}" stroke="#fff" stroke-width="0.5">'
                   f'<title>{esc(title)}</title></rect>')
        if s["others"]:
            svg.append(f'<rect x="{x(s["start"]):.1f}" y="{y["batch"]}" '
                       f'width="{max(1.5, x(s["end"]) - x(s["start"])):.1f}" height="{min(16, 4 * len(s["others"]))}" '
                       f'fill="#2a9d8f"><title>{esc("batch shared with " + others)}</title></rect>')
    for e in tokens:
        svg.append(f'<line x1="{x(e["ts"]):.1f}" x2="{x(e["ts"]):.1f}" y1="{y["tokens"]}" y2="{y["tokens"] + 16}" '
                   f'stroke="#222" stroke-width="1"><title>token {e["index"]} at {esc(fmt_ms(e["t"]))}</title></line>')
    if tokens:
        tx = x(tokens[0]["ts"])
        svg.append(f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="4" y2="{y["tokens"] + 20}" stroke="#d62828" '
                   f'stroke-dasharray="3,2"/><text x="{tx + 3:.1f}" y="{y["tokens"] + 32}" class="tt-ttft">TTFT '
                   f'{esc(fmt_ms(tokens[0]["t"]))}</text>')
    height = y["tokens"] + 40
    axis = (f'<text x="{LEFT}" y="{height - 2}" class="tt-lane">0 ms</text>'
            f'<text x="{WIDTH - 10}" y="{height - 2}" text-anchor="end" class="tt-lane">{esc(fmt_ms(span))}</text>')
    chart = (f'<svg class="tt-timeline" viewBox="0 0 {WIDTH} {height}" width="100%" '
             f'preserveAspectRatio="xMinYMin meet">{"".join(svg)}{axis}</svg>')
    rows = "".join(
        f"<tr><td>{s['step']}</td><td><span style='color:{KIND_COLOR.get(s['kind'], '#888')}'>■</span> "
        f"{esc(s['kind'])}</td><td>{s['tokens']}</td><td>{esc(fmt_ms(s['end'] - s['start']))}</td>"
        f"<td>{esc(', '.join(s['others'])) or '—'}</td></tr>" for s in steps[-8:][::-1])
    table = ("<table class='tt-table'><thead><tr><th>step</th><th>kind</th><th>tokens</th><th>forward</th>"
             "<th>batch shared with</th></tr></thead><tbody>" + rows + "</tbody></table>")
    n_pre = sum(1 for s in steps if s["kind"] == "prefill")
    summary = [f"{len(steps)} engine steps: {n_pre} prefill chunk{'s' if n_pre != 1 else ''}, "
               f"{len(steps) - n_pre} decode/verify",
               f"tokenize {fmt_ms(tok.get('seconds', 0))}"]
    if steps:
        summary.append(f"queue {fmt_ms(steps[0]['start'] - arrive['ts'])}")
    if finish and "ttft" in finish:
        split = finish.get("ttft_split", {})
        summary.append(f"TTFT {fmt_ms(finish['ttft'])} = " + " + ".join(
            f"{k} {fmt_ms(v)}" for k, v in split.items()))
    elif tokens:
        summary.append(f"TTFT {fmt_ms(tokens[0]['t'])}")
    shared = sum(1 for s in steps if s["others"])
    partners: dict[str, int] = {}
    for s in steps:
        for rid in s["others"]:
            partners[rid] = partners.get(rid, 0) + 1
    summary.append(f"{shared} step{'s' if shared != 1 else ''} shared with other requests"
                   + (" (" + ", ".join(f"{rid}: {n}" for rid, n in sorted(partners.items())) + ")" if partners else ""))
    info = "<div class='tt-lines'><div>" + esc(" · ".join(summary)) + "</div></div>"
    return panel("Timeline", info + chart + table)
