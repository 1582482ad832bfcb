"""What the stage functions read of one request, gathered in one pass over its events.

journey() runs several times a second while a request streams, over traces of thousands of
events (a 500-token answer at capture level full): the events are walked once here, and
every stage function reads these lists and counts instead of walking them again."""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Sequence

from visualizers.compact import lens_layers
from visualizers import i18n
from visualizers._html import esc, prob, show_piece  # prob: stage modules import it from here
from visualizers.i18n.catalog import translations
from visualizers.logit_lens import first_top

FIRST = ("request.arrive", "tokenize", "prefix_cache.lookup", "finish", "trace.truncated", "kv.transfer", "trace.cut")
KEPT = ("sample", "logit_lens", "spec", "embed", "token", "kv.free")  # every event of these types, in order


@dataclass(frozen=True)
class Part:
    """What one stage function returns: journey() adds the key and title."""
    text: str  # HTML, escaped
    panels: tuple[str, ...]
    chip: str = ""  # the map's key number, escaped ("" not reached)
    skipped: bool = False
    reached: bool = True


@dataclass
class Trail:
    """The fold of one request's events so far. journey() is called several times a second over
    a list that only grows while the request streams; given the same Trail each time, it reads
    only the events added since the last call (a list rebuilt, e.g. a replay moved back, is
    noticed by its first event and read again from the start)."""
    request_id: str
    read: int = 0  # how many events of the list are folded in
    head: dict | None = None  # the list's first event: another list starts the fold again
    first: dict[str, dict] = field(default_factory=dict)
    kept: dict[str, list[dict]] = field(default_factory=lambda: {t: [] for t in KEPT})
    lens_tops: list[int | None] = field(default_factory=list)  # first_top of each logit_lens event
    steps: list[dict] = field(default_factory=list)  # schedule.step events whose batch holds this request
    kinds: list[str] = field(default_factory=list)  # this request's part of each of those steps
    collectives: list[dict] = field(default_factory=list)  # schedule.collective events with this request
    moe: dict[int, list[dict]] = field(default_factory=dict)  # layer -> its routing events, in order

    def fold(self, events: Sequence[dict]) -> "Trail":
        """events[self.read:] folded in (all of them again when the list is another), in place."""
        if len(events) < self.read or (events and self.head is not None and events[0] is not self.head):
            self.__init__(self.request_id)  # type: ignore[misc]  # the same object, emptied
        rid = self.request_id
        for e in events[self.read:]:  # each event once, ever
            t = e["type"]
            if t in self.kept:
                self.kept[t].append(e)
                if t == "logit_lens":
                    self.lens_tops.append(first_top(lens_layers(e)))
            elif t == "schedule.step":
                mine = [x["kind"] for x in e["batch"] if x["request_id"] == rid]
                if mine:
                    self.steps.append(e)
                    self.kinds += mine
            elif t == "moe":
                self.moe.setdefault(e["layer"], []).append(e)
            elif t == "schedule.collective":
                if any(x.get("request_id") == rid for x in e.get("batch", [])):
                    self.collectives.append(e)
            elif t in FIRST and t not in self.first:
                self.first[t] = e
        self.read, self.head = len(events), events[0] if events else None
        return self


@dataclass
class Facts:
    model: dict
    request_id: str
    body: dict | None
    outputs: Sequence[dict]
    trail: Trail
    kv_peak: dict | None = None  # the block pool when this request held the most tokens
    truncated: dict | None = None  # the trace's {"step", "limit_bytes"[, "token"]} when its cap stopped captures
    position: int | None = None  # the selected token (None: the newest pass); see pass_of
    hidden_from: int | None = None  # the classroom hides tokens from this position on (until the reveal)
    layer: int | None = None  # the selected layer (its MoE routing is quoted; None: the first MoE layer)
    lang: str = i18n.DEFAULT  # the language of the words (the stages converted to the catalogs: said, said_n)

    @classmethod
    def read(cls, model: dict, request_id: str, body: dict | None, events: Sequence[dict],
             outputs: Sequence[dict], trail: Trail | None = None, **kw) -> "Facts":
        if trail is None or trail.request_id != request_id:
            trail = Trail(request_id)
        f = cls(model, request_id, body, outputs, trail.fold(events), **kw)
        if f.truncated is None and "trace.truncated" in f.first:
            f.truncated = f.first["trace.truncated"]
        if f.hidden_from is None and f.cut is not None:
            f.hidden_from = int(f.cut["position"])
        return f

    @property
    def cut(self) -> dict | None:
        """A classroom's note of its cut (app/classroom/mask.py): {"position", "asked", "ended", "drawn_at"}.
        These events end before the token at "position": the words speak of the request up to
        there, not of one still running."""
        return self.first.get("trace.cut")

    @property
    def ended(self) -> bool:
        """Has the request finished (its finish event, or a classroom's cut of a finished request)?"""
        return self.finish is not None or bool((self.cut or {}).get("ended"))

    # the trail's lists, read as the request's
    first = property(lambda self: self.trail.first)
    kept = property(lambda self: self.trail.kept)
    steps = property(lambda self: self.trail.steps)
    kinds = property(lambda self: self.trail.kinds)
    collectives = property(lambda self: self.trail.collectives)

    @property
    def moe_first_layer(self) -> list[dict]:
        """The routing events of the quoted MoE layer: the selected one, else the first routed."""
        moe = self.trail.moe
        if self.layer in moe:
            return moe[self.layer]
        return next(iter(moe.values()), [])

    # --- counts the stages share -----------------------------------------------------
    @property
    def generated(self) -> list[dict]:
        return [o for o in self.outputs if o.get("token_id", -1) >= 0]

    @property
    def idle(self) -> bool:
        """No request yet: the page before its first Send (a preview body at most)."""
        return not self.request_id and not self.outputs and not self.steps

    @property
    def untraced(self) -> bool:
        """Tokens came out but no engine step was recorded (capture level off)."""
        return bool(self.generated) and not self.steps

    @property
    def n_prompt(self) -> int:
        tok, look = self.first.get("tokenize"), self.first.get("prefix_cache.lookup")
        if tok:
            return int(tok["count"])
        if look:
            return int(look.get("prompt_tokens", 0))
        usage = (self.finish or {}).get("usage") or {}
        return int(usage.get("prompt_tokens") or 0)

    @property
    def n_gen(self) -> int:
        return len(self.generated) or int(((self.finish or {}).get("usage") or {}).get("completion_tokens", 0))

    @property
    def cached_tokens(self) -> int:
        return int((self.first.get("prefix_cache.lookup") or {}).get("cached_tokens", 0))

    @property
    def finish(self) -> dict | None:
        """The finish event, or (capture level off) what the last output says."""
        fin = self.first.get("finish")
        if fin is None and self.outputs and self.outputs[-1].get("finished") and self.hidden_from is None:
            last = self.outputs[-1]
            return {"reason": last.get("finish_reason"), "usage": last.get("usage") or {}}
        return fin

    def pass_of(self, kind: str) -> dict | None:
        """The `sample` or `logit_lens` event of the selected pass: selecting the token at
        position p means the pass that read it and predicted p + 1 (whose events carry
        position p + 1); no selection, or one without that event: the newest pass."""
        evs = self.kept[kind]
        if not evs:
            return None
        if self.position is not None:
            want = self.position + 1
            for e in evs:
                if e["position"] == want:
                    return e
        return max(evs, key=lambda e: e["position"])  # a lens may come after a later token's

    def label(self, position: int) -> str | None:
        """The text of the token at a position (prompt or answer), None when not known."""
        tok = self.first.get("tokenize")
        n = self.n_prompt
        if position < n:
            if tok and position < len(tok["tokens"]):
                t = tok["tokens"][position]
                return t.get("text") or t.get("piece") or ""
            return None
        gen = self.generated
        i = position - n
        return gen[i].get("text", "") if 0 <= i < len(gen) else None


def asked(f: "Facts") -> bool:
    """Has a classroom question set the hidden position? (Before one, the answer is hidden from
    its first token, and no position is named: the class has not been asked about one.)"""
    return bool(f.cut.get("asked")) if f.cut is not None else f.hidden_from is not None


def hidden_text(position: int, asked: bool, num=str) -> str:
    """What a classroom hides, as a clause (num formats the position: n for HTML)."""
    if asked:
        return f"the answer from position {num(position)} on is hidden until the reveal"
    return "the answer is hidden until the presenter asks the class to predict it (or shows it)"


def hidden_rest(f: "Facts") -> str:
    """What a classroom hides: "the answer from position N on is hidden until the reveal"."""
    return hidden_text(f.hidden_from, asked(f), n)


def before_cut(f: "Facts") -> str:
    """Where a classroom's view ends: "before position N", or "before the first answer token"."""
    return f"before position {n(f.hidden_from)}" if asked(f) else "before the first answer token"


def said_hidden_rest(f: "Facts") -> str:
    """hidden_rest() in the stage's language (the stages converted to the catalogs)."""
    if asked(f):
        return said(f, "the answer from position {position} on is hidden until the reveal", position=n(f.hidden_from))
    return said(f, "the answer is hidden until the presenter asks the class to predict it (or shows it)")


def said_before_cut(f: "Facts") -> str:
    """before_cut() in the stage's language (the stages converted to the catalogs)."""
    if asked(f):
        return said(f, "before position {position}", position=n(f.hidden_from))
    return said(f, "before the first answer token")


def hidden_sentence(f: "Facts") -> str:
    """What a classroom says where the hidden token's draw would be."""
    if asked(f):
        return said(f, "The draw at position {position} is hidden until the class has predicted it: the presenter "
                       "reveals the model's answer here.", position=n(f.hidden_from))
    return said(f, "The answer's draws are hidden until the presenter asks the class \u201cpredict the next token\u201d "
                   "(or shows the answer): they appear here then.")


# --- words ---------------------------------------------------------------------------
def n(x: float) -> str:
    """A number in bold (ints with thousands separators, floats with two decimals)."""
    return f"<b>{x:,}</b>" if isinstance(x, int) else f"<b>{x:,.2f}</b>"


def _text(s: str) -> str:
    """A sentence as HTML text (not an attribute: an apostrophe stays as written)."""
    return html.escape(s, quote=False)


def said(f: Facts, msgid: str, **html: str) -> str:
    """A sentence from the catalogs in the stage's language, escaped, its {names} filled with
    the given HTML (numbers in bold: n())."""
    return said_in(f.lang, msgid, **html)


def said_in(lang: str, msgid: str, **html: str) -> str:
    """said() for words written without the request's Facts (a model's facts only)."""
    return _text(i18n.gettext(lang, msgid)).format(**html)


def said_n(f: Facts, singular: str, plural_: str, k: int, **html: str) -> str:
    """said() in the form the count k takes in the stage's language ({n}: k in bold)."""
    text = _text(translations(f.lang).ngettext(singular, plural_, k))
    return text.format(**{"n": f"<b>{i18n.number(f.lang, k)}</b>", **html})


def p(*sentences: str) -> str:
    """Paragraphs of the sentences that are not empty."""
    return "".join(f"<p>{s}</p>" for s in sentences if s)


def plural(count: int, noun: str, many: str | None = None) -> str:
    """'1 KV head', '3 KV heads' (the number in bold)."""
    return f"{n(count)} {noun if count == 1 else many or noun + 's'}"


def count(k: int, noun: str) -> str:
    """'1 token', '25 tokens' (plain text, for a chip)."""
    return f"{k:,} {noun}{'' if k == 1 else 's'}"


def quote(text: str) -> str:
    """A token's text as every panel shows it (␣ for a space, ↵ for a newline), escaped."""
    return f"«{show_piece(text)}»"
