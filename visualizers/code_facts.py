"""What really ran for one request, and the request's values beside the code, read from its
trace events (plain dicts): the way each stage with several ways took, as the engine reported
it (schedule.step's `attention`, the spec event's `method`, the prefill's steps), the others
named; and a few numbers the marked lines made (the prefix cache's hits, the top-p cut, the
accepted proposals). One short line a stage, for its section, beside the code view."""
from __future__ import annotations

import re

from typing import Mapping, Sequence

from visualizers._html import esc, prob, said_html
from visualizers.i18n import gettext

ATTENTION_WAYS = ("c_fused", "c_kernel", "triton", "torch")
SPEC_WAYS = ("draft", "ngram")
MOE_WAYS = ("moe_c_block", "moe_c", "moe_torch")
INTAKE_WAYS = ("http", "page")
KNOWN = {"layers": ATTENTION_WAYS + MOE_WAYS, "spec": SPEC_WAYS, "request": INTAKE_WAYS}


def _steps(steps: Sequence[int], lang: str = "en") -> str:
    """"step 3", "steps 2–9" (their span), for a line."""
    s = sorted(set(steps))
    return gettext(lang, "step {step}", step=s[0]) if len(s) == 1 else \
        gettext(lang, "steps {first}–{last}", first=s[0], last=s[-1])


WATCHED = ("schedule.step", "spec", "prefix_cache.lookup", "sample")


def ways_ran(events: Sequence[Mapping], request_id: str) -> dict[str, dict[str, list[int]]]:
    """{stage key: {way: the steps it ran in}} for the stages with several ways that the trace
    reports: "layers" (the attention's way each step), "spec" (the proposer), "timeline"
    ("whole" or "chunked" prefill)."""
    return read(events, request_id)[0]


def read(events: Sequence[Mapping], request_id: str) -> tuple[dict[str, dict[str, list[int]]], dict[str, Mapping]]:
    """One pass over the events (the page asks several times a second while a request streams):
    (ways_ran's answer, {event type: the event values() quotes}: the first prefix lookup, the
    newest sample, the last spec round)."""
    out: dict[str, dict[str, list[int]]] = {}
    quoted: dict[str, Mapping] = {}
    prefill, way, moe = [], "", ""
    for e in events:
        kind = e.get("type")
        if kind not in WATCHED:
            continue
        if kind == "schedule.step":
            mine = next((b for b in e.get("batch", ()) if b.get("request_id") == request_id or not request_id), None)
            if mine is None:
                continue
            # said where it is news to a request in the step (recorded since 2026-12-06; older traces never
            # say): a step that does not say it ran the way of the request's step before
            way, moe = e.get("attention") or way, e.get("moe") or moe
            for w in (way, moe):
                if w:
                    out.setdefault("layers", {}).setdefault(w, []).append(e["step"])
            if mine.get("kind") == "prefill":
                prefill.append(e["step"])
        elif kind == "spec" and e.get("method"):
            out.setdefault("spec", {}).setdefault(e["method"], []).append(e["step"])
        if kind == "prefix_cache.lookup" and kind in quoted:
            continue  # the first lookup
        if kind == "sample" and kind in quoted and e.get("position", 0) < quoted[kind].get("position", 0):
            continue  # the newest draw (a live step's come before the steps between live ones)
        quoted[kind] = e
    if prefill:
        out["timeline"] = {"chunked" if len(prefill) > 1 else "whole": prefill}
    return out, quoted


def _ran_line(key: str, ways: Mapping[str, list[int]], names: Mapping[str, str], where: Mapping[str, str],
              lang: str = "en") -> str:
    names = {w: gettext(lang, name) for w, name in names.items()}  # the code map's words (extract reads them)
    if key == "request":
        (way, _), = ways.items()
        other = [names.get(w, w) for w in INTAKE_WAYS if w != way]
        return gettext(lang, "{ran}. Not taken here: {others}", ran=names.get(way, way) + (
            f" ({where[way]})" if way in where else ""), others="; ".join(other))
    if key == "timeline":
        (way, steps), = ways.items()
        return (gettext(lang, "the prompt in {n} chunks ({steps}): chunked prefill", n=len(steps),
                        steps=_steps(steps, lang)) if way == "chunked" else
                gettext(lang, "the whole prompt in one pass ({steps}); a longer one is cut into chunks",
                        steps=_steps(steps, lang)))
    known = [w for w in KNOWN[key] if w not in MOE_WAYS or any(m in ways for m in MOE_WAYS)]  # a dense model: no MoE
    ran = "; ".join(gettext(lang, "{way} in {steps}", way=names.get(w, w), steps=_steps(s, lang))
                    + (f" ({where[w]})" if w in where else "") for w, s in ways.items())
    others = [names.get(w, w) for w in known if w not in ways]
    return gettext(lang, "{ran}. Not taken here: {others}", ran=ran, others="; ".join(others)) if others else ran


def values(events: Sequence[Mapping], key: str, quoted: Mapping[str, Mapping] | None = None, lang: str = "en") -> str:
    """This request's numbers from the stage's marked lines, one line ("" none held). quoted:
    read()'s, where the caller has it (else read from the events)."""
    last = quoted if quoted is not None else read(events, "")[1]
    if key == "prefix" and "prefix_cache.lookup" in last:
        e = last["prefix_cache.lookup"]
        hits = e.get("cached_blocks") or []
        keys = "".join(f", chain hash {h & (2**64 - 1):016x}" if i == 0 else f" → {h & (2**64 - 1):016x}"
                       for i, h in enumerate(e.get("hashes") or []))  # (recorded since 2026-12-06)
        full = e.get("full_blocks", "?")
        return (gettext(lang, "hits.append(bid) ran {n} times of {full} full blocks: blocks {hits} reused{keys}; "
                              "{tokens} tokens", n=len(hits), full=full, hits=hits, keys=keys,
                        tokens=e.get("cached_tokens", 0)) if hits else
                gettext(lang, "no full block to hash: chain_hash never ran, nothing reused") if full == 0 else
                gettext(lang, "the first chain_hash of {full} full blocks missed: nothing reused", full=full))
    if key == "sampling" and "sample" in last:
        e = last["sample"]
        params, stages = e.get("params") or {}, e.get("stages") or {}
        kept = (stages.get("top_p") or {}).get("kept")
        if params.get("greedy"):
            return gettext(lang, "greedy: the argmax, p = {p}", p=prob(e.get("token_prob", 0)))
        cut = gettext(lang, "top_p = {top_p} kept {kept} tokens", top_p=params.get("top_p"), kept=kept) \
            if kept is not None else ""
        return "; ".join(x for x in (cut, gettext(lang, "drew p = {p}", p=prob(e.get("token_prob", 0)))) if x)
    if key == "spec" and "spec" in last:
        e = last["spec"]
        return (gettext(lang, "the last round: {accepted} of {k} proposals accepted", accepted=e.get("accepted", 0),
                        k=e.get("k", 0))
                + (gettext(lang, ", then a {kind} token", kind=gettext(lang, e["token_kind"])) if e.get("token_kind")
                   else ""))  # the kind: "bonus" or "corrected", as the speculation panel says them
    return ""


def ran_html(key: str, events: Sequence[Mapping], request_id: str, names: Mapping[str, str],
             where: Mapping[str, str] | None = None, known: tuple | None = None, lang: str = "en") -> str:
    """The stage's "ran here" and "values" lines (HTML, escaped), "" where the trace says nothing.
    names: each way in words; where: a way's function as "path:line Name", named beside it;
    known: read(events, request_id), where the caller read it once for every stage; lang: the
    language of the lines' words (the ways' names and the code stay as written)."""
    ran, quoted = known if known is not None else read(events, request_id)
    ways = ran.get(key)
    lines = []
    if ways:
        lines.append(said_html(lang, "{label} {ran}", label="<b>" + said_html(lang, "Ran for this request:") + "</b>",
                               ran=_code_marked(esc(_ran_line(key, ways, names, where or {}, lang)), where or {})))
    said = values(events, key, quoted, lang)
    style = ways_style(key, ways) if ways and key in KNOWN else ""
    if said:
        lines.append(said_html(lang, "{label} {values}", label="<b>" + said_html(lang, "Its values:") + "</b>",
                               values=esc(said)))
    return style + "".join(f"<div class='tt-code-ran'>{line}</div>" for line in lines)


def _code_marked(line: str, where: Mapping[str, str]) -> str:
    """An escaped line with each function it names ("path:line Name") as code, in one pass."""
    refs = sorted({esc(r) for v in where.values() for r in v.split(", ")}, key=len, reverse=True)
    return re.sub("|".join(map(re.escape, refs)), lambda m: f"<code>{m[0]}</code>", line) if refs else line


def ways_style(key: str, ways: Mapping[str, list[int]]) -> str:
    """A rule set that marks, in the stage's code view (drawn once, before any request), the
    functions of the ways this request took and of those it did not: the view is never sent
    again, the request's few bytes go with its stage's words."""
    known = KNOWN[key]
    box = f".tt-code-box[data-key='{key}'] .tt-code-fn"  # key and ways: known names, never text from outside
    ran = ",".join(f"{box}[data-path='{w}'] .tt-way-ran" for w in known if w in ways)
    not_taken = ",".join(f"{box}[data-path='{w}'] .tt-way-not" for w in known if w not in ways)
    rules = [f"{sel} {{ display: inline; }}" for sel in (ran, not_taken) if sel]
    return f"<style>{' '.join(rules)}</style>" if rules else ""
