"""The journey of one request, stage by stage, in the order a request travels
(ARCHITECTURE.md): the page's pipeline map and sections and the classroom's stages all
come from `journey`, so the page and the classroom never disagree.

Each Stage carries the words for its section (a few sentences with this request's own
numbers), the key number its chip in the map shows, whether this request skips the stage
(no MoE, no draft, one device: one line in the map, no half-empty panel), and the page's
panels drawn under it."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

# (key, title) in the order a request travels; the keys name the page's sections
JOURNEY = (("request", "Request"), ("tokens", "Tokenize"), ("prefix", "Prefix cache"), ("embedding", "Embed"),
           ("layers", "Layers"), ("timeline", "Prefill, then decode"), ("kv", "KV pages"),
           ("logit_lens", "LM head and logit lens"), ("sampling", "Sample"), ("answer", "Stream"),
           ("batching", "Batching"), ("spec", "Speculation"), ("parallel", "Beyond one device"))
KEYS = tuple(k for k, _ in JOURNEY)


@dataclass(frozen=True)
class Stage:
    key: str  # one of KEYS
    title: str
    text: str  # HTML, already escaped: what happens there, with this request's numbers
    panels: tuple[str, ...]  # the page's panels (app/page/live_view.PANELS) drawn under it
    chip: str = ""  # the map's key number for this request ("27 tokens", "16 cached"), escaped; "" not reached
    skipped: bool = False  # this request does not pass this stage (no MoE, no draft, one device)
    reached: bool = True  # False: the live request has not got there yet


def journey(model: dict, request_id: str, body: dict | None, events: Sequence[dict], outputs: Sequence[dict],
            kv_peak: dict | None = None, truncated: dict | None = None) -> list[Stage]:
    """Every stage of KEYS, in that order, for this request (live or recorded)."""
    from visualizers.walkthrough import stages  # the classroom's stages, until each has its own function
    old = {s.key: s for s in stages(model, request_id, body, events, outputs, kv_peak, truncated)}
    out = []
    for key, title in JOURNEY:
        s = old.get(key)
        text = s.text if s else ""
        if key == "answer" and "finish" in old:
            text += old["finish"].text
        out.append(Stage(key, title, text, s.panels if s else ()))
    return [replace(st, title=f"{i} · {st.title}") for i, st in enumerate(out, 1)]
