"""The journey of one request, stage by stage, in the order a request travels
(ARCHITECTURE.md): the page's pipeline map and sections and the classroom's stages all
come from `journey`, so the page and the classroom never disagree.

Each Stage carries the words for its section (a few sentences with this request's own
numbers), the key number its chip in the map shows, whether this request skips the stage
(no MoE, no draft, one device: one line in the map, no half-empty panel), and the page's
panels drawn under it. The words come from one function per stage (visualizers/stages/)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from visualizers import i18n, stages as st
from visualizers.i18n import N_

# (key, title, the stage's function) in the order a request travels; the keys name the page's sections;
# the titles are in the catalogs (journey() gives them in its language)
STAGES: tuple[tuple[str, str, Callable[[st.Facts], st.Part]], ...] = (
    ("request", N_("Request"), st.request), ("tokens", N_("Tokenize"), st.tokenize),
    ("prefix", N_("Prefix cache"), st.prefix), ("embedding", N_("Embed"), st.embed),
    ("layers", N_("Layers"), st.layers),
    ("timeline", N_("Prefill, then decode"), st.prefill_decode), ("kv", N_("KV pages"), st.kv),
    ("logit_lens", N_("LM head and logit lens"), st.lens), ("sampling", N_("Sample"), st.sampling),
    ("answer", N_("Stream"), st.stream), ("batching", N_("Batching"), st.batching),
    ("spec", N_("Speculation"), st.speculation), ("parallel", N_("Beyond one device"), st.beyond))
JOURNEY = tuple((k, t) for k, t, _ in STAGES)
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
    stopped: bool = False  # the request ended (stopped, aborted) before it got here: it never will


def journey(model: dict, request_id: str, body: dict | None, events: Sequence[dict], outputs: Sequence[dict],
            kv_peak: dict | None = None, truncated: dict | None = None, *, position: int | None = None,
            hidden_from: int | None = None, layer: int | None = None, trail: st.Trail | None = None,
            lang: str = "en") -> list[Stage]:
    """Every stage of KEYS, in that order, for this request (live or recorded).
    kv_peak: the block pool when this request held the most tokens (the KV stage quotes it, so
    its words and its grid agree); truncated: the trace's {"step", "limit_bytes"} when the
    per-request cap stopped its captures; position: the selected token (the words speak of the
    pass that read it and predicted the next, as the panels do; None: the newest pass);
    hidden_from: a classroom question's position, whose token and every later one the events
    given no longer hold (the words say they are hidden, not that the request is running);
    layer: the selected layer (the layers stage quotes its MoE routing, as the MoE panel shows it);
    trail: what an earlier call read of this same growing list of events (stages.Trail): keep one
    per live view and pass it each time, and a call reads only the events added since; lang: the
    language of the words (visualizers.i18n; the stages not yet in the catalogs speak English)."""
    facts = st.Facts.read(model, request_id, body, events, outputs, kv_peak=kv_peak, truncated=truncated,
                          position=position, hidden_from=hidden_from, layer=layer, trail=trail, lang=lang)
    parts = [words(facts) for _, _, words in STAGES]
    unrun = ran_no_step(facts)
    # a request that streams has passed every stage before the stream, recorded or not (capture level off);
    # one that ended before any engine step ran it streamed only its end, and passed none of the engine's
    if unrun:
        parts = [replace(part, reached=False) if key in ENGINE_STAGES else part for key, part in zip(KEYS, parts)]
    passed = False
    for i in range(KEYS.index("answer"), -1, -1):
        own = parts[i].reached
        passed = passed or (own and not (unrun and KEYS[i] == "answer"))
        parts[i] = replace(parts[i], reached=own or passed)
    ended = facts.finish is not None and not facts.idle and facts.hidden_from is None
    before = i18n.gettext(lang, "stopped before")
    return [Stage(key, f"{i} · {i18n.gettext(lang, title)}", part.text, part.panels,
                  part.chip if part.reached else (before if ended and not part.skipped else ""),
                  part.skipped, part.reached, stopped=ended and not part.reached and not part.skipped)
            for i, ((key, title, _), part) in enumerate(zip(STAGES, parts), 1)]


# the stages only an engine step reaches (the way in, the stream and the plan of devices come before
# or without one)
ENGINE_STAGES = ("embedding", "layers", "timeline", "kv", "logit_lens", "sampling", "batching", "spec")


def ran_no_step(f: st.Facts) -> bool:
    """Did the request end before any engine step ran it (stopped while it waited)? Known only
    when it was traced: at capture level off no step is recorded, and no token proves none ran."""
    return (f.finish is not None and not f.steps and not f.generated and "request.arrive" in f.first
            and f.hidden_from is None)
