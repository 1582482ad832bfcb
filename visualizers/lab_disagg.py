"""The disaggregation experiment's figures and sentences (app/lab/disaggregation.py's result):
pure functions of the result's dict."""
from __future__ import annotations

from visualizers import i18n
from visualizers.i18n import N_, gettext
from visualizers.lab import KIND_COLOR, bars, distribution, esc, layout, stream_gaps
from visualizers.lab_verdict import seconds, share
from visualizers.lab_words import hover, word

SPLIT_WORDS = (N_("TTFT"), N_("before the handover"), N_("waiting to send"), N_("on the wire"),
               N_("received, scattered"), N_("TTFT (colocated) / before the handover"),
               N_("colocated"), N_("disaggregated"))  # (the settings' names, under the TTFT bars)
SPLIT_COLORS = {"TTFT": "#466ec8", "before the handover": "#466ec8", "waiting to send": "#c9ccd8",
                "on the wire": "#d62828", "received, scattered": "#f08c1e"}


def figures(result: dict, lang: str = i18n.DEFAULT) -> list[dict]:
    settings = result["settings"]
    if not settings:
        return []
    gaps = stream_gaps(settings)
    return [bars(settings, (("long_ttft_median_s", N_("long prompts' TTFT (median)"), "s"),
                            ("gap_p99_s", N_("streams' gap p99"), "s"), ("longest_stall_s", N_("longest stall"), "s")),
                 N_("The long prompts' wait against the streams' stalls"), lang),
            distribution(gaps, N_("The streams' gaps between tokens"), lang=lang),
            prefill_beside_streams(settings, lang), ttft_split(settings, lang), engine_tracks(settings, lang),
            bars(settings, (("tokens_per_s", N_("tokens/s"), N_("tokens/s")),),
                 N_("Throughput: every request's tokens"), lang)]


def stream_steps(setting: dict) -> list[dict]:
    """The serving engine's steps that decoded a stream (the steps a stream's next token waited on)."""
    ids = {r["request_id"] for r in setting["per_request"] if r["role"] == "stream"}
    return [st for st in setting["steps"]
            if any(b["request_id"] in ids and b["kind"] == "decode" for b in st["batch"])]


def prefill_beside_streams(settings: list[dict], lang: str = i18n.DEFAULT) -> dict:
    """Prefill tokens each of the streams' steps carried: the chunks colocated, none disaggregated."""
    data = []
    for s in settings:
        steps = stream_steps(s)
        data.append({"type": "bar", "name": esc(word(lang, s["setting"]["label"])),
                     "x": list(range(1, len(steps) + 1)),
                     "y": [st["prefill_tokens"] for st in steps],
                     "customdata": [[st["step"], st["decode_tokens"], st["seconds"] * 1000] for st in steps],
                     "hovertemplate": hover(lang, N_("step %{customdata[0]}: %{y} prefill tokens beside "
                                                  "%{customdata[1]} decoded, %{customdata[2]:.2f} ms"
                                                  "<extra>%{fullData.name}</extra>"))})
    return {"data": data, "layout": layout(gettext(lang, "Prefill tokens in each step the streams decoded in"),
                                           barmode="group",
                                           xaxis={"title": {"text": gettext(lang, "the streams' step")}},
                                           yaxis={"title": {"text": gettext(lang, "prefill tokens beside the "
                                                                                  "decodes")}})}


def ttft_split(settings: list[dict], lang: str = i18n.DEFAULT) -> dict:
    """Each long prompt's TTFT, and where a handover's part of it went (its kv.transfer event):
    waiting for the send, on the wire, received into the decode pool and the first token out."""
    parts: dict[str, dict] = {}
    for s in settings:
        moved = {e["request_id"]: e for e in s["events"] if e["type"] == "kv.transfer"}
        longs = [r for r in s["per_request"] if r["role"] == "long prompt" and r["ttft_s"] is not None]
        for i, r in enumerate(longs, 1):
            x = gettext(lang, "long prompt {n}", n=i) + f"<br>{esc(gettext(lang, s['setting']['name']))}"  # short
            e = moved.get(r["request_id"])
            if e is None:
                split = {"TTFT": r["ttft_s"]}
            else:
                hand = e["handover_ms"] / 1e3
                split = {"before the handover": r["ttft_s"] - hand, "waiting to send": e["queue_ms"] / 1e3,
                         "on the wire": e["wire_ms"] / 1e3,
                         "received, scattered": max(0.0, hand - (e["queue_ms"] + e["wire_ms"]) / 1e3)}
            for name, v in split.items():
                t = parts.setdefault(name, {"type": "bar", "name": gettext(lang, name), "x": [], "y": [],
                                            "customdata": [], "marker": {"color": SPLIT_COLORS[name]},
                                            "hovertemplate": hover(lang, N_("%{x}<br>{part}: %{y:.4f} s "
                                                                         "(%{customdata:.1%} of its TTFT)"
                                                                         "<extra></extra>"), part=gettext(lang, name))})
                t["x"].append(x)
                t["y"].append(v)
                t["customdata"].append(v / r["ttft_s"] if r["ttft_s"] else 0.0)
    if "TTFT" in parts and "before the handover" in parts:  # one legend entry for the same colour
        parts["TTFT"]["name"] = gettext(lang, "TTFT (colocated) / before the handover")
        parts["before the handover"]["showlegend"] = False
    return {"data": list(parts.values()),
            "layout": layout(gettext(lang, "The long prompts' TTFT, and the handover's part of it"), barmode="stack",
                             yaxis={"title": {"text": gettext(lang, "seconds")}}, xaxis={"automargin": True})}


def engine_tracks(settings: list[dict], lang: str = i18n.DEFAULT) -> dict:
    """Every engine's steps on a track of its own over time: colocated one track, disaggregated
    the prefill engine's and the decode engine's side by side. Coloured by what a step did."""
    traces: dict[str, dict] = {}
    rows = []
    for s in settings:
        label = esc(word(lang, s["setting"]["label"]))
        tracks = [(gettext(lang, "decode engine") if s["extra"].get("prefill_steps") else gettext(lang, "engine"),
                   s["steps"])]
        if s["extra"].get("prefill_steps"):
            tracks.insert(0, (gettext(lang, "prefill engine"), s["extra"]["prefill_steps"]))
        for name, steps in tracks:
            row = f"{label} · {name}"
            rows.append(row)
            for st in steps:
                kind = "prefill" if st["prefill_tokens"] else "decode"
                named = gettext(lang, "a step with prefill") if kind == "prefill" else gettext(lang, "decode only")
                t = traces.setdefault(kind, {"type": "bar", "orientation": "h", "name": named, "x": [], "base": [],
                                             "y": [], "marker": {"color": KIND_COLOR[kind]}, "customdata": [],
                                             "hovertemplate": hover(lang, N_("%{y}<br>step %{customdata[0]}: "
                                                                          "%{customdata[1]} prefill + %{customdata[2]} "
                                                                          "decode tokens<br>%{base:.4f} s, %{x:.4f} s "
                                                                          "long<extra></extra>"))})
                t["x"].append(st["seconds"])
                t["base"].append(st["start_s"])
                t["y"].append(row)
                t["customdata"].append([st["step"], st["prefill_tokens"], st["decode_tokens"]])
    return {"data": list(traces.values()),
            "layout": layout(gettext(lang, "Each engine's steps over time"), barmode="overlay",
                             height=140 + 40 * len(rows),
                             xaxis={"title": {"text": gettext(lang, "seconds since the first arrival")}},
                             yaxis={"autorange": "reversed", "automargin": True, "categoryorder": "array",
                                    "categoryarray": rows})}


def sentences(result: dict, lang: str = i18n.DEFAULT) -> list[str]:
    by = {s["setting"]["name"]: s["metrics"] for s in result["settings"]}
    co, dis = by.get("colocated"), by.get("disaggregated")
    if co is None or dis is None:
        return []
    chunk = next(s["setting"]["options"]["chunk"] for s in result["settings"])
    num = lambda x: i18n.number(lang, x)  # noqa: E731
    out = [gettext(lang, "Colocated with chunks of {chunk}, {co_with} of the streams' {co_steps} steps also prefilled "
                         "({co_tokens} tokens, up to {co_most} in one); disaggregated, {dis_with} of {dis_steps} did, "
                         "and {handovers} requests' pages crossed to the decode engine: {blocks} blocks × {per_block} "
                         "B = {mib} MiB.", chunk=chunk, co_with=co["stream_steps_with_prefill"],
                   co_steps=co["stream_steps"], co_tokens=num(co["prefill_tokens_beside_streams"]),
                   co_most=co["max_prefill_tokens_beside_streams"], dis_with=dis["stream_steps_with_prefill"],
                   dis_steps=dis["stream_steps"], handovers=dis["handovers"], blocks=dis["handover_blocks"],
                   per_block=num(dis["bytes_per_block"]), mib=f"{dis['handover_bytes'] / 2 ** 20:.2f}")]
    sets = {s["setting"]["name"]: s for s in result["settings"]}
    a, b = sets["disaggregated"], sets["colocated"]
    stall = share(a, b, "longest_stall_s", N_("disaggregated, the streams' longest stall was {pct} of colocated's"),
                  N_("the longest stall"), seconds, lang)
    ttft = share(a, b, "long_ttft_median_s", N_("the long prompts' median TTFT was {pct} of colocated's"),
                 N_("the long TTFT"), seconds, lang)
    said = gettext(lang, "Timed: {stall} (p99 gap {co_p99} → {dis_p99}, medians); {ttft}", stall=stall,
                   co_p99=_ms(co["gap_p99_s"]), dis_p99=_ms(dis["gap_p99_s"]), ttft=ttft)
    if dis.get("handover_share_of_ttft") is not None:
        said += gettext(lang, "; the handover took {share} of the disaggregated TTFT (median {median} ms: {queue} ms "
                              "before the send began, while the decode engine took the request between its steps, "
                              "and {wire} ms on the wire)", share=f"{dis['handover_share_of_ttft']:.1%}",
                        median=f"{dis['handover_ms_median']:.1f}", queue=f"{dis['queue_ms_median']:.1f}",
                        wire=f"{dis['wire_ms_median']:.2f}")
    out.append(said + gettext(lang, "; ") + share(a, b, "tokens_per_s", N_("throughput was {pct} of colocated's"),
                                                  N_("throughput"), lambda v: f"{v:.1f} tokens/s", lang)
               + gettext(lang, "."))
    out.append(_hardware(result.get("machine") or {}, co, dis, lang))
    if dis.get("same_tokens_as_colocated") is False:
        out.append(gettext(lang, "The disaggregated engine's tokens differed from the colocated engine's on this run."))
    return out


def _hardware(machine: dict, co: dict, dis: dict, lang: str = i18n.DEFAULT) -> str:
    """The honest part: what the two processes ran on."""
    cpus = machine.get("cpus")
    if str(dis.get("device", "cpu")).startswith("cuda"):
        return gettext(lang, "The colocated engine ran on one GPU; disaggregated, the prefill and decode engines had a "
                             "GPU each and the pages crossed between them on NCCL.")
    load = machine.get("load_average")
    busy = gettext(lang, " and with whatever else ran here (load average {load})", load=f"{load:.1f}") \
        if isinstance(load, (int, float)) else ""
    return gettext(lang, "On this machine's {cpus} CPU cores the two processes share the same cores: the colocated "
                         "engine ran {co_threads} torch thread(s) in one process, the disaggregated one {dis_threads} "
                         "in each of its two, so it had twice the threads on the same cores, and its prefill still "
                         "competes with its decodes for them{busy}; the handover crossed memory, not a network, where "
                         "separate GPUs would give each side its own compute.", cpus=cpus,
                   co_threads=co["threads_per_process"], dis_threads=dis["threads_per_process"], busy=busy)


def _ms(s: float | None) -> str:
    return "–" if s is None else f"{s * 1000:.0f} ms" if s >= 0.01 else f"{s * 1000:.1f} ms"
