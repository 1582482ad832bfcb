"""Stages 6 and 11: the request's life on one time axis: queue, tokenize, prefill
chunks, each decode (or verify) step, TTFT, and who else shared each step's batch."""
from __future__ import annotations

from typing import Sequence

from visualizers._html import empty, esc, panel, said_html
from visualizers.i18n import N_, gettext, ngettext, number

WIDTH, LANE, LEFT = 760, 22, 70
MAX_TITLED = 64  # steps (and tokens) drawn one element each, with a hover title
TABLE_ROWS = 8  # the step table lists the newest steps only
KIND_COLOR = {"prefill": "#466ec8", "decode": "#f08c1e", "verify": "#a050c8"}


def _ms(lang: str, seconds: float) -> str:
    """A duration in milliseconds, as the timeline writes every one: '1,234.5 ms' (never '-0.0 ms')."""
    value = seconds * 1000
    return f"{number(lang, 0.0 if round(value, 1) == 0 else value, 1)} ms"


def timeline_steps(events: Sequence[dict], request_id: str) -> list[dict]:
    """One row per engine step that computed this request: start/end (s), kind, tokens, batch."""
    steps = []
    # what each step's tracing cost after its pass (engine/trace/events.py: schedule_traced): not in its bar
    traced = {e["step"]: e for e in events if e["type"] == "schedule.traced"}
    for e in events:
        if e["type"] != "schedule.step":
            continue
        mine = next((b for b in e["batch"] if b["request_id"] == request_id), None)
        if mine is None:
            continue
        steps.append({"step": e["step"], "start": e["ts"] - e["forward_seconds"], "end": e["ts"],
                      "kind": mine["kind"], "tokens": mine["num_tokens"], "batch_tokens": e["num_tokens"],
                      "others": [b["request_id"] for b in e["batch"] if b["request_id"] != request_id],
                      "trace": traced.get(e["step"], {}).get("trace_seconds")})
    return steps


def tracing_line(steps: Sequence[dict], lang: str = "en") -> str:
    """What watching cost: the steps' tracing after their passes, apart from the engine's own bars."""
    cost = [s["trace"] for s in steps if s.get("trace") is not None]
    if not cost:
        return ""
    own = sum(s["end"] - s["start"] for s in steps)
    return "<div class='tt-note'>" + said_html(lang, "tracing (the captures' events, the logit lens) took {cost} after the "
                                                "steps' passes (the bars, {own}, hold the passes' own work and what a "
                                                "pass keeps)", cost=esc(_ms(lang, sum(cost))), own=esc(_ms(lang, own))) \
        + "</div>"


def queue_seconds(by_type: dict[str, list[dict]]) -> float | None:
    """How long the request waited to be admitted: from its arrival (tokenized) to the step whose
    scheduler admitted it. One definition, quoted everywhere: the engine's own figure (the
    `finish` event's TTFT split) once the request ends, the prefix-cache lookup (made at
    admission) before that."""
    finish = (by_type.get("finish") or [None])[0]
    split = (finish or {}).get("ttft_split") or {}
    if "queue" in split:
        return max(0.0, split["queue"])
    arrive, lookup = (by_type.get("request.arrive") or [None])[0], (by_type.get("prefix_cache.lookup") or [None])[0]
    if arrive is not None and lookup is not None:
        return max(0.0, lookup["ts"] - arrive["ts"])
    return None


QUEUE_NAME = N_("queue (arrival to admission by the scheduler)")
LANES = {"tokenize": N_("tokenize"), "queue": N_("queue"), "prefill": N_("prefill"), "decode": N_("decode"),
         "batch": N_("batch"), "tokens": N_("tokens"), "verify": N_("verify"),  # a lane's (or a step kind's) name
         "first_sample": N_("first sample"), "kv_transfer": N_("kv transfer")}  # (and the TTFT's parts)


def step_counts(steps: Sequence[dict], lang: str = "en") -> str:
    """'16 engine steps: 1 prefill chunk, 15 decode' (verify steps named only where there are any:
    a request with no draft has none)."""
    kinds = [s["kind"] for s in steps]
    n_pre, n_ver = kinds.count("prefill"), kinds.count("verify")
    n_dec = len(kinds) - n_pre - n_ver
    text = gettext(lang, "{steps}: {chunks}, {decode} decode", steps=ngettext(lang, "{n} engine step", "{n} engine steps",
                                                                             len(kinds)),
                   chunks=ngettext(lang, "{n} prefill chunk", "{n} prefill chunks", n_pre), decode=number(lang, n_dec))
    return text + (gettext(lang, ", {n} verify", n=number(lang, n_ver)) if n_ver else "")


def untraced_timeline_html(tokens: Sequence[dict], finished: bool, level: str = "off",
                           steps: int | None = None, lang: str = "en") -> str:
    """A request traced at level off: no engine step's work is recorded, only when each token
    streamed (tokens: {"index", "t"} with t in seconds since arrival) and, steps, from how many
    engine steps (each streamed output names its step: the replay's frames)."""
    missing = (gettext(lang, "capture level {level} records no engine step's work (no prefill, decode or batch "
                             "bars): only when each token streamed, and which engine step drew it", level=level)
               if steps is not None else
               gettext(lang, "capture level {level} records no engine step's work (no prefill, decode or batch "
                             "bars): only when each token streamed", level=level))
    title = gettext(lang, "Timeline")
    if not tokens:
        return panel(title, empty(gettext(lang, "{missing} — and no token streamed", missing=missing) if finished
                                  else gettext(lang, "{missing}; none yet", missing=missing)))
    end = max(t["t"] for t in tokens)
    span = max(end, 1e-3)

    def x(t: float) -> float:
        return LEFT + t / span * (WIDTH - LEFT - 10)

    ticks = " ".join(f"M{x(t['t']):.1f} 8V24" for t in tokens)
    streamed = ngettext(lang, "{n} token", "{n} tokens", len(tokens))
    lane, arrival = said_html(lang, LANES["tokens"]), said_html(lang, "0 ms (arrival)")
    svg = (f'<text x="4" y="21" class="tt-lane">{lane}</text>'
           f'<path d="{ticks}" stroke="#222" stroke-width="1"><title>{esc(streamed)}</title></path>'
           f'<text x="{LEFT}" y="38" class="tt-lane">{arrival}</text>'
           f'<text x="{WIDTH - 10}" y="38" text-anchor="end" class="tt-lane">{esc(_ms(lang, span))}</text>')
    chart = (f'<svg class="tt-timeline" viewBox="0 0 {WIDTH} 42" width="100%" preserveAspectRatio="xMinYMin meet">'
             f'{svg}</svg>')
    rate = ""
    if len(tokens) > 1 and end > tokens[0]["t"]:
        rate = gettext(lang, " · then {rate} tokens/s", rate=number(lang, (len(tokens) - 1) / (end - tokens[0]["t"]), 1))
    made = gettext(lang, "{tokens} streamed, drawn in {steps}", tokens=streamed,
                   steps=ngettext(lang, "{n} engine step", "{n} engine steps", steps)) if steps is not None else \
        gettext(lang, "{tokens} streamed", tokens=streamed)
    line = gettext(lang, "{made} · TTFT {ttft}{rate} · last token at {end}", made=made, ttft=_ms(lang, tokens[0]["t"]),
                   rate=rate, end=_ms(lang, end))
    info = f"<div class='tt-lines'><div>{esc(line)}</div><div class='tt-note'>{esc(missing)}</div></div>"
    return panel(title, info + chart)


THIN = 'vector-effect="non-scaling-stroke"'  # a line stays 1 px however much the chart is squeezed


def chart_frame(svg: Sequence[str], lanes: Sequence[str], height: int, ttft: tuple[float, str] | None,
                span: str, lang: str = "en") -> str:
    """The chart's bars (the SVG, squeezed to the panel's width, its height kept) with the lanes'
    names beside it and the TTFT and time axis under it as HTML: on a phone the whole SVG shrank to
    a third, its words to 4 px."""
    def pct(xv: float) -> float:
        return (xv - LEFT) / (WIDTH - LEFT) * 100

    names = "".join(f"<div>{esc(gettext(lang, LANES.get(n, n)))}</div>" for n in lanes)
    mark = ""
    if ttft:  # the label starts at the TTFT line, or ends at it past the middle: it never leaves the plot
        at = pct(ttft[0])
        side = f"left:{at:.1f}%" if at <= 50 else f"right:{100 - at:.1f}%"
        mark = f"<div class='tt-tl-row'><span class='tt-ttft' style='{side}'>{esc(ttft[1])}</span></div>"
    ends = (f"<div class='tt-tl-row'><span style='left:0'>0 ms</span><span style='right:{pct(WIDTH) - pct(WIDTH - 10):.1f}%'>"
            f"{esc(span)}</span></div>")
    return (f"<div class='tt-tl'><div class='tt-tl-lanes'>{names}</div><div class='tt-tl-plot'>"
            f'<svg class="tt-timeline" viewBox="{LEFT} 0 {WIDTH - LEFT} {height}" preserveAspectRatio="none" '
            f'width="100%" height="{height}">{"".join(svg)}</svg>{mark}{ends}</div></div>')


def steps_table(steps: list[dict], finish: dict | None, lang: str = "en") -> str:
    """The newest TABLE_ROWS steps of the request, newest first (or why there is none)."""
    # "step" is this request's own count (as the replay's "step k of N" counts), the engine's number beside it
    number_title = esc(gettext(lang, "the engine's step number"))
    rows = "".join(
        f"<tr><td>{k} <small class='tt-note' title='{number_title}'>#{s['step']}</small></td>"
        f"<td><span style='color:{KIND_COLOR.get(s['kind'], '#888')}'>■</span> "
        f"{esc(gettext(lang, LANES.get(s['kind'], s['kind'])))}</td><td>{s['tokens']}</td>"
        f"<td>{esc(_ms(lang, s['end'] - s['start']))}</td>"
        f"<td>{esc(', '.join(s['others'])) or '—'}</td></tr>"
        for k, s in list(enumerate(steps, 1))[-TABLE_ROWS:][::-1])
    # the table lists the newest TABLE_ROWS steps (the chart draws every one): said above it, not left to guess
    newest = ("<div class='tt-note tt-table-note'>" + said_html(lang, "the table lists the newest {rows} of these {n} "
                                                                 "steps; the chart above draws every one",
                                                           rows=str(TABLE_ROWS), n=number(lang, len(steps)))
              + "</div>" if len(steps) > TABLE_ROWS else "")
    heads = (N_("step (engine #)"), N_("kind"), N_("tokens"), N_("forward"), N_("batch shared with"))
    table = (newest + "<table class='tt-table tt-tl-steps'><thead><tr>"
             + "".join(f"<th>{esc(gettext(lang, h))}</th>" for h in heads)
             + "</tr></thead><tbody>" + rows + "</tbody></table>")
    if not steps:  # no row to list: say why instead of an empty table
        table = empty(gettext(lang, "no engine step has run this request: it ended before the scheduler admitted it")
                      if finish else gettext(lang, "no engine step has run this request yet"))
    return table


def summary_line(steps: list[dict], finish: dict | None, tok: dict, queue: float | None, tokens: list[dict],
                 lang: str = "en") -> str:
    """The steps by kind, the TTFT's parts, and the steps shared with other requests."""
    summary = [step_counts(steps, lang)]
    split = (finish or {}).get("ttft_split") or {}
    queue_name = gettext(lang, QUEUE_NAME)
    if finish and "ttft" in finish:  # the engine's own split: tokenize and queue are quoted there, once
        summary.append(f"TTFT {_ms(lang, finish['ttft'])} = " + " + ".join(
            f"{queue_name if k == 'queue' else gettext(lang, LANES.get(k, k.replace('_', ' ')))} {_ms(lang, v)}"
            for k, v in split.items()))
        traced = finish.get("trace_seconds")
        if traced:  # the split is the stream's; what watching put into it, apart (the engine's own is the rest)
            summary[-1] += " (" + gettext(lang, "tracing {t} of it", t=_ms(lang, traced["ttft"])) + ")"
    else:
        summary.append(f"{gettext(lang, LANES['tokenize'])} {_ms(lang, tok.get('seconds', 0))}")
        if queue is not None:
            summary.append(f"{queue_name} {_ms(lang, queue)}")
        if tokens:
            summary.append(f"TTFT {_ms(lang, tokens[0]['t'])}")
    shared = sum(1 for s in steps if s["others"])
    partners: dict[str, int] = {}
    for s in steps:
        for rid in s["others"]:
            partners[rid] = partners.get(rid, 0) + 1
    summary.append(ngettext(lang, "{n} step shared with other requests", "{n} steps shared with other requests", shared)
                   + (" (" + ", ".join(f"{rid}: {n}" for rid, n in sorted(partners.items())) + ")" if partners else ""))
    return " · ".join(summary)


def timeline_html(events: Sequence[dict], request_id: str, lang: str = "en") -> str:
    """events: this request's events plus the schedule.step events that include it; lang: the
    language of its words."""
    by_type: dict[str, list[dict]] = {}
    for e in events:
        by_type.setdefault(e["type"], []).append(e)
    arrive = (by_type.get("request.arrive") or [None])[0]
    if arrive is None:
        return panel(gettext(lang, "Timeline"), empty(gettext(lang, "the request has not arrived yet")))
    tok = (by_type.get("tokenize") or [{}])[0]
    t0 = arrive["ts"] - tok.get("seconds", 0.0)
    steps = timeline_steps(events, request_id)
    tokens = by_type.get("token", [])
    finish = (by_type.get("finish") or [None])[0]
    queue = queue_seconds(by_type)
    # (the finish event follows the lenses computed after the last token: it ends the axis only where no token did)
    t_end = max([arrive["ts"] + (queue or 0.0)] + [s["end"] for s in steps] + [e["ts"] for e in tokens]
                + ([finish["ts"]] if finish and not tokens else []))
    span = max(t_end - t0, 1e-3)

    def x(t: float) -> float:
        return LEFT + (t - t0) / span * (WIDTH - LEFT - 10)

    lanes = ["tokenize", "queue", "prefill", "decode", "batch", "tokens"]
    y = {name: 8 + i * LANE for i, name in enumerate(lanes)}
    svg: list[str] = []  # the lanes' names are HTML beside the chart (chart_frame): they keep their size
    svg.append(f'<rect x="{x(t0):.1f}" y="{y["tokenize"]}" width="{max(1.5, x(arrive["ts"]) - x(t0)):.1f}" '
               f'height="16" fill="#7a7a8c"><title>{esc(gettext(lang, LANES["tokenize"]))} '
               f'{esc(_ms(lang, tok.get("seconds", 0)))}</title></rect>')
    if queue is not None:
        svg.append(f'<rect x="{x(arrive["ts"]):.1f}" y="{y["queue"]}" '
                   f'width="{max(1.5, x(arrive["ts"] + queue) - x(arrive["ts"])):.1f}" height="16" fill="#b9b9c6">'
                   f'<title>{esc(gettext(lang, QUEUE_NAME))}: {esc(_ms(lang, queue))}</title></rect>')
    # Each step its own <rect> with a hover title while there are few; past MAX_TITLED, one <path> per
    # kind: a long answer's chart stays a few KB, not a node per step redrawn with every update.
    titled = len(steps) <= MAX_TITLED
    paths: dict[tuple[str, str], list[str]] = {}
    for s in steps:
        lane = "prefill" if s["kind"] == "prefill" else "decode"
        x0, w = x(s["start"]), max(1.5, x(s["end"]) - x(s["start"]))
        others = ", ".join(s["others"]) or gettext(lang, "none")
        if titled:
            title = (gettext(lang, "step {step} · {kind} · {tokens} tokens of {batch} in the batch · {time} · shared "
                                   "with: {others}", step=s["step"], kind=gettext(lang, LANES.get(s["kind"], s["kind"])),
                             tokens=s["tokens"], batch=s["batch_tokens"], time=_ms(lang, s["end"] - s["start"]),
                             others=others)
                     + (gettext(lang, " · then tracing {time}", time=_ms(lang, s["trace"]))
                        if s.get("trace") is not None else ""))
            svg.append(f'<rect x="{x0:.1f}" y="{y[lane]}" width="{w:.1f}" height="16" '
                       f'fill="{KIND_COLOR.get(s["kind"], "#888")}" stroke="#fff" stroke-width="0.5">'
                       f'<title>{esc(title)}</title></rect>')
        else:
            paths.setdefault((s["kind"], lane), []).append(f"M{x0:.1f} {y[lane]}h{w:.1f}v16h-{w:.1f}z")
        if s["others"]:
            h = min(16, 4 * len(s["others"]))
            if titled:
                shared = said_html(lang, "batch shared with {others}", others=esc(others))
                svg.append(f'<rect x="{x0:.1f}" y="{y["batch"]}" width="{w:.1f}" height="{h}" fill="#2a9d8f">'
                           f'<title>{shared}</title></rect>')
            else:
                paths.setdefault(("batch", "batch"), []).append(f"M{x0:.1f} {y['batch']}h{w:.1f}v{h}h-{w:.1f}z")
    for (kind, lane), parts in paths.items():
        n = len(parts)
        what = ngettext(lang, "{n} step shared its batch", "{n} steps shared their batch", n) if kind == "batch" \
            else ngettext(lang, "{n} {kind} step", "{n} {kind} steps", n, kind=gettext(lang, LANES.get(kind, kind)))
        what = gettext(lang, "{what} (the table lists the newest)", what=what)
        svg.append(f'<path d="{"".join(parts)}" fill="{KIND_COLOR.get(kind, "#2a9d8f")}" stroke="#fff" '
                   f'stroke-width="0.5"><title>{esc(what)}</title></path>')
    if len(tokens) <= MAX_TITLED:
        for e in tokens:
            svg.append(f'<line x1="{x(e["ts"]):.1f}" x2="{x(e["ts"]):.1f}" y1="{y["tokens"]}" y2="{y["tokens"] + 16}" '
                       f'stroke="#222" stroke-width="1" {THIN}><title>'
                       + said_html(lang, "token {i} at {time}", i=str(e["index"]), time=_ms(lang, e["t"])) + '</title></line>')
    else:
        ticks = "".join(f"M{x(e['ts']):.1f} {y['tokens']}v16" for e in tokens)
        svg.append(f'<path d="{ticks}" stroke="#222" stroke-width="1" {THIN}><title>'
                   f'{esc(ngettext(lang, "{n} token", "{n} tokens", len(tokens)))}</title></path>')
    ttft = None
    if tokens:
        ttft = (x(tokens[0]["ts"]), f"TTFT {_ms(lang, tokens[0]['t'])}")
        svg.append(f'<line x1="{ttft[0]:.1f}" x2="{ttft[0]:.1f}" y1="4" y2="{y["tokens"] + 20}" stroke="#d62828" '
                   f'stroke-dasharray="3,2" {THIN}/>')
    chart = chart_frame(svg, lanes, y["tokens"] + 20, ttft, _ms(lang, span), lang)
    table = steps_table(steps, finish, lang)
    summary = summary_line(steps, finish, tok, queue, tokens, lang)
    info = "<div class='tt-lines'><div>" + esc(summary) + "</div>" + tracing_line(steps, lang) + "</div>"
    return panel(gettext(lang, "Timeline"), info + chart + table)
