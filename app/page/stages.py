"""The page's journey: the pipeline map on top and each stage's heading and sentence, from
visualizers.journey.journey (the classroom's stages too, so the page and the classroom never
disagree), and which of the page's panels sit under which stage.

journey() is recomputed several times a second while a request streams: `JourneyClock`
throttles it, and only what changed goes to the browser."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from visualizers import i18n
from visualizers._html import esc
from visualizers.journey import JOURNEY, KEYS, Stage, journey
from visualizers.stages.way_in import NEVER

JOURNEY_EVERY = 0.3  # seconds between journey() calls while a request streams (the 0.5 s live target holds)

# where a panel goes when no stage lists it (journey's stage may draw it in the classroom only)
HOME = {"logit_lens": "logit_lens", "parallel": "parallel", "choices": "answer", "moe": "layers", "attention": "layers",
        "answer": "answer", "timeline": "timeline", "kv": "kv", "spec": "spec", "request": "request",
        "tokens": "tokens", "prefix": "prefix", "embedding": "embedding", "sampling": "sampling"}


def section_panels(stages: Sequence[Stage], panels: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Each stage key -> the page panels drawn under it: a panel under the first stage that
    lists it (Stage.panels), else under its home stage; every panel exactly once."""
    placed: dict[str, list[str]] = {k: [] for k in KEYS}
    seen: set[str] = set()
    for st in stages:
        for p in st.panels:
            if p in panels and p not in seen and st.key in placed:
                placed[st.key].append(p)
                seen.add(p)
    for p in panels:
        if p not in seen:
            placed[HOME.get(p, "request")].append(p)
    return {k: tuple(v) for k, v in placed.items()}


def empty_stages(model: dict) -> list[Stage]:
    """The stages before any request (their panels decide the page's sections)."""
    try:
        return journey(model, "", None, [], [])
    except Exception:  # noqa: BLE001 - a stage function that needs events: the layout must still build
        return [Stage(k, t, "", ()) for k, t in JOURNEY]


def _chip(st: Stage, live: bool) -> str:
    """One stage in the map: its title and key number, lit once the request passed it."""
    title = esc(st.title.split(" · ", 1)[-1])
    state = "tt-map-skip" if st.skipped else ("tt-map-lit" if st.reached and live else "tt-map-dim")
    number = f"<small>{st.chip}</small>" if st.chip and not st.skipped else ""  # chip: escaped by journey
    return (f"<a class='tt-map-chip {state}' href='#tt-stage-{esc(st.key)}' data-key='{esc(st.key)}'>"
            f"<b>{title}</b>{number}</a>")


def map_html(stages: Sequence[Stage], live: bool = True, lang: str = "en") -> str:
    """The pipeline map: one chip a stage in journey order, the skipped ones as one line."""
    shown = [s for s in stages if not s.skipped]
    skipped = [s for s in stages if s.skipped]
    arrows = "<span class='tt-map-arrow'>→</span>".join(_chip(s, live) for s in shown)
    names = " · ".join(esc(s.title.split(" · ", 1)[-1]) for s in skipped)
    said = esc(i18n.gettext(lang, "skipped by this request: {stages}")).format(stages=names)
    skip = f"<div class='tt-map-skipped'>{said}</div>" if skipped else ""
    return f"<div class='tt-map' id='tt-map-inner'>{arrows}{skip}</div>"


def _never(st: Stage, lang: str) -> bool:
    """Does the stage's sentence say the request never got there (in English or the stage's language)?"""
    return f"<p>{NEVER}" in st.text or f"<p>{esc(i18n.gettext(lang, NEVER))}" in st.text


def stage_html(st: Stage, lang: str = "en") -> str:
    """A stage's heading and its sentence (Stage.text is escaped HTML already)."""
    # stopped before it, or a finished request that never got here: say so ("not reached yet"
    # would promise it still might)
    badge = i18n.gettext(lang, "stopped before this stage") if st.stopped else \
        i18n.gettext(lang, "never reached") if _never(st, lang) else i18n.gettext(lang, "not reached yet")
    waiting = "" if st.reached else f" <span class='tt-note'>{esc(badge)}</span>"
    return (f"<div class='tt-stage-head' data-key='{esc(st.key)}'><h2>{esc(st.title)}{waiting}</h2>"
            f"<div class='tt-stage-text'>{st.text}</div></div>")


@dataclass
class JourneyClock:
    """One tab's journey: recomputed at most every JOURNEY_EVERY seconds while streaming, and
    only the pieces whose HTML changed are sent again."""
    sent: dict[str, str] = field(default_factory=dict)  # output name -> the HTML last sent
    at: float = -1e9

    def due(self, now: float) -> bool:
        return now - self.at >= JOURNEY_EVERY

    def updates(self, stages: Sequence[Stage], now: float, live: bool = True, force: bool = False,
                lang: str = "en") -> dict:
        """{"map": html, "stage:KEY": html, "section:KEY": visible} for what changed (lang: the
        words around the stages' own: the skipped line, the badges)."""
        self.at = now
        fresh = {"map": map_html(stages, live, lang)}
        for st in stages:
            fresh[f"stage:{st.key}"] = stage_html(st, lang)
            fresh[f"section:{st.key}"] = not st.skipped
        out = {k: v for k, v in fresh.items() if force or self.sent.get(k) != v}
        self.sent.update(out)
        return out
