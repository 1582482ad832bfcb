"""The request's values beside the lines that made them, in a stage's code view: a few
variables (the ids the chat template and the encoder gave, the hash that hit, the top-p cut,
the drawn token's probability, the router's picks, the accepted proposals, the new blocks and
the slot, the tokens so far, the batch), each named as engine/code_map.py's `values` name it
and read from the request's trace events (plain dicts).

The code view is drawn once per process and never sent again, so the values go with the
stage's words: a small rule set (`values_style`) that writes each value after its line
(`::after`), its text escaped for a CSS string (every character but letters, digits and
spaces as a hex escape: nothing in it can end the string or the <style>)."""
from __future__ import annotations

from typing import Mapping, Sequence

from visualizers._html import prob

MOST = 120  # characters of one value: a few variables, not a debugger


def _short(items: Sequence, n: int = 8) -> str:
    """[3, 7, 9, …] with at most n items."""
    head = ", ".join(str(x) for x in list(items)[:n])
    return f"[{head}{', …' if len(items) > n else ''}]"


def _at(rows: Sequence[Mapping], position: int | None, start: str = "start", count=None) -> Mapping | None:
    """The event whose rows hold `position` (None: the last)."""
    if position is None:
        return rows[-1] if rows else None
    for e in reversed(rows):
        n = count(e) if count else len(e.get("experts") or ())
        if e.get(start, 0) <= position < e.get(start, 0) + n:
            return e
    return rows[-1] if rows else None


def _mine(events: Sequence[Mapping], request_id: str) -> dict[str, list[Mapping]]:
    """The request's events by type (the step's own events: those whose batch holds it)."""
    out: dict[str, list[Mapping]] = {}
    for e in events:
        kind = e.get("type")
        if kind == "schedule.step":
            mine = next((b for b in e.get("batch", ()) if b.get("request_id") == request_id), None)
            if mine is not None:
                out.setdefault(kind, []).append({**mine, "step": e.get("step"), "size": len(e["batch"]),
                                                 "step_tokens": e.get("num_tokens")})
        elif e.get("request_id") == request_id or not request_id:
            out.setdefault(kind, []).append(e)
    return out


def _sampling(got: dict[str, list[Mapping]], out: dict[str, str]) -> None:
    e = max(got["sample"], key=lambda s: s.get("position", 0))  # the newest (a live step's come first)
    params, stages = e.get("params") or {}, e.get("stages") or {}
    said = f"token {e.get('token_id', '?')} {e.get('token_text', '')!r}, p = {prob(e.get('token_prob', 0))}"
    if params.get("greedy"):  # the argmax: no knob, no draw ran
        out["sampling.greedy"] = f"greedy: {said}"
        return
    if params.get("temperature") is not None:
        out["sampling.temperature"] = f"temperature = {params['temperature']}"
    kept = (stages.get("top_p") or {}).get("kept")
    if kept is not None and (params.get("top_p") or 1) < 1:
        out["sampling.top_p"] = f"top_p = {params['top_p']}: {kept} tokens kept"
    out["sampling.drawn"] = f"drawn: {said}"


def beside(events: Sequence[Mapping], request_id: str, position: int | None = None,
           layer: int | None = None) -> dict[str, str]:
    """{value name: its text} for the request (position: the pass the panels show, None: the
    last; layer: the MoE layer the page picked), only where the trace holds the value."""
    got, out = _mine(events, request_id), {}
    if got.get("tokenize"):
        e = got["tokenize"][0]
        ids = [t["id"] for t in e.get("tokens") or () if isinstance(t, Mapping) and "id" in t]
        out["tokens.ids"] = (f"{e.get('count', '?')} ids" + (f" {_short(ids)}" if ids else "")
                             + (", through the chat template" if e.get("chat_template") else ""))
    if got.get("prefix_cache.lookup"):
        e = got["prefix_cache.lookup"][0]
        hits, hashes = e.get("cached_blocks") or [], e.get("hashes") or []
        full = e.get("full_blocks", "?")
        out["prefix.hits"] = ("never ran: no full block to hash" if full == 0 else
                              f"hits = {_short(hits)} of {full} full blocks")
        if hashes:
            out["prefix.hash"] = f"h = {hashes[-1] & (2**64 - 1):016x} (the last that hit)"
    if got.get("kv.alloc"):
        e = got["kv.alloc"][-1]
        out["kv.new"] = f"new = {_short(e.get('blocks') or [])}, block table {_short(e.get('table') or [])}"
    if got.get("kv.fill"):
        f = (got["kv.fill"][-1].get("fills") or [{}])[-1]
        if "block" in f:
            out["kv.slot"] = (f"block {f['block']}, offset {f['offset']}: {f['count']} "
                              f"token{'s' if f['count'] != 1 else ''} written")
    if got.get("sample"):
        _sampling(got, out)
    if got.get("spec"):
        e = got["spec"][-1]
        out["spec.accepted"] = f"accepted = {e.get('accepted', 0)} of k = {e.get('k', 0)} (the last round)"
    if got.get("token"):
        out["answer.sofar"] = f"{len(got['token'])} tokens so far"
    if got.get("schedule.step"):
        e = _at(got["schedule.step"], position, count=lambda x: x.get("num_tokens") or 0)
        out["batching.size"] = (f"step {e['step']}: {e['size']} sequence{'s' if e['size'] != 1 else ''}, "
                                f"{e.get('step_tokens', '?')} tokens")
    moe = [e for e in got.get("moe", ()) if layer is None or e.get("layer") == layer] or got.get("moe", [])
    if moe:
        e = _at(moe, position)
        row = (position - e.get("start", 0)) if position is not None and e.get("start", 0) <= position < \
            e.get("start", 0) + len(e["experts"]) else len(e["experts"]) - 1
        w = ", ".join(f"{x:.2f}" for x in e["weights"][row])
        out["moe.picks"] = f"layer {e['layer']}, position {e.get('start', 0) + row}: experts {e['experts'][row]}, " \
                           f"weights [{w}]"
    return {k: v[:MOST] for k, v in out.items()}


def css_string(text: str) -> str:
    """text as a CSS string: letters, digits and spaces as they are, every other character a hex escape."""
    return '"' + "".join(c if c.isalnum() or c == " " else f"\\{ord(c):x} " for c in text) + '"'


def values_style(key: str, names: Sequence[str], said: Mapping[str, str]) -> str:
    """The rules that write the stage's values (those of `names` the trace holds) after their
    lines in its code view; "" when none."""
    box = f".tt-code-box[data-key='{key}'] .tt-cl"  # key and names: the map's own, never text from outside
    rules = [f"{box}[data-v='{n}']::after {{ content: {css_string('  ← ' + said[n])}; }}"
             for n in dict.fromkeys(names) if n in said]
    return f"<style>{' '.join(rules)}</style>" if rules else ""
