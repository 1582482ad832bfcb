"""One page's view of one request: it takes the items of its subscription, keeps them by
stage, and redraws only the panels whose inputs changed (and the heavy ones at most a
few times a second), so the browser gets small, cheap updates while tokens stream."""
from __future__ import annotations

import threading
import time
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Callable

import visualizers as viz
from app.page import panel_words as words
from visualizers.choices import choices_html
from visualizers.selection import Selection, frozen_html, newest_with_lens, select_pass
from visualizers.stages import Trail

PANELS = ("request", "prefix", "tokens", "embedding", "attention", "kv", "moe", "sampling", "spec", "answer",
          "timeline", "logit_lens", "parallel", "choices")
HEAVY = {"embedding": 0.2, "attention": 0.2, "moe": 0.2, "kv": 0.2, "tokens": 0.3,
         "sampling": 0.2, "spec": 0.2, "logit_lens": 0.2, "parallel": 0.45}  # panel -> least seconds between
# redraws while streaming: every stage follows the engine within 0.5 s (the attention index made the
# heavy panels cheap enough: app.measure passes on the embedded model and SmolLM2 at full); the
# browser's cost grows with the DOM it patches, so each yield also draws only what its time budget allows
# (app/page/streaming.RENDER_BUDGET) and tokens never queue behind a redraw; the timeline is light (it
# lists the newest 8 steps): redrawn at every update, as the answer is

# which panels an event type feeds
FEEDS = {"request.arrive": ("timeline",), "tokenize": ("tokens", "timeline"), "prefix_cache.lookup": ("prefix",),
         "schedule.step": ("timeline",), "embed": ("embedding",), "attention": ("attention",), "moe": ("moe",),
         "sample": ("sampling",), "logit_lens": ("logit_lens",), "schedule.collective": ("parallel",), "spec": ("spec",), "token": ("answer", "tokens", "timeline"),
         "finish": ("answer", "timeline", "kv"),
         "kv.transfer": ("parallel",)}  # disaggregated (engine/disagg): the handover
# the panels that show the selected pass (select_pass), and those a byte cap can freeze
SELECTED = ("embedding", "attention", "kv", "moe", "logit_lens", "sampling")
# the panels that name a forward pass: redrawn together, in one update, from one Selection, so no
# picture ever shows two passes (each redrew on its own clock: KV, Sampling and Speculation at 0.5 s
# showed an older pass than Embedding, Attention and the lens at 0.45 s)
ONE_PASS = SELECTED + ("spec",)
# seconds between the group's redraws while streaming: the server's round of one update and the browser's
# redraw take ~0.2-0.3 s (benchmarks.measure cuts the lag in three), so 0.45 s put the pass a token
# later than 0.5 s (the measure's "pass panels" line); at 0.2 s a `full` trace's newest lens (every
# 0.2 s) could wait a whole period for its redraw: SmolLM2's pass panels' worst lag 0.47-0.59 s at 0.2,
# 0.40-0.46 s at 0.1 (2 CPUs, the browser beside the server, 2026-12-07)
ONE_PASS_EVERY = 0.1
CAPTURED = words.CAPTURED
# the per-token kinds the panels list by position: a `full` trace's come in the order computed, a
# live step's (the first, one every 0.2 s, the last) before the steps between them (built after the
# answer); by the position a pass's rows start at, not the step (a disaggregated prefill's count
# steps of its own)
POSITION_OF = {"sample": "position", "logit_lens": "position", "embed": "start", "attention": "q_start",
               "moe": "start"}


def _keep(events: list[dict], it: dict) -> None:
    """it into a kind's list: after every event at its position or before (arrival order among equals)."""
    key = POSITION_OF.get(it["type"])
    if key is None or not events or events[-1].get(key, 0) <= it.get(key, 0):
        events.append(it)
    else:
        events.insert(bisect_right(events, it.get(key, 0), key=lambda e: e.get(key, 0)), it)


@dataclass
class LiveView:
    model: dict  # EngineService.model_info()
    piece: Callable[[int], str]
    is_special: Callable[[int], bool]
    body: dict = field(default_factory=dict)
    validation: dict | None = None
    request_id: str | None = None
    speculative: bool = True
    layer: int = 0
    head: int = 0
    position: int | None = None  # the token clicked: its pass is selected (None: the newest pass)
    truncated: dict | None = None  # the trace.truncated event: the byte cap stopped the tensor captures
    events: list[dict] = field(default_factory=list)
    by_type: dict[str, list[dict]] = field(default_factory=dict)
    outputs: list[dict] = field(default_factory=list)
    pool: dict | None = None  # the KV block pool, every request's blocks: its kv.pool events folded
    decode_pools: dict[int, dict] = field(default_factory=dict)  # disaggregated: decode engine j > 0's pool
    error: str | None = None
    finished: bool = False
    dirty: set[str] = field(default_factory=lambda: set(PANELS))
    drawn_at: dict[str, float] = field(default_factory=dict)
    token_seen_at: list[float] = field(default_factory=list)  # when each streamed token reached this view
    replaying: bool = False  # a recording shown at one of its steps (not a live request)
    live: bool = True  # a request's own stream (False: a recording's view: its lenses all there, some cut)
    drawn: dict[str, str] = field(default_factory=dict)  # each panel's last drawn HTML
    n: int = 1  # choices asked for (n > 1: the others' outputs arrive in this view's queue too)
    others: dict[str, list[dict]] = field(default_factory=dict)  # choice id ("<id>.i") -> its outputs
    own_done: bool = False  # choice 0 has finished (the view is finished once every choice has)
    drawn_pass: dict[str, int | None] = field(default_factory=dict)  # ONE_PASS panel -> the pass (read) it shows
    shown_read: int | None = None  # the pass the ONE_PASS panels show now (the journey's words speak of it)
    _pinned: Selection | None = None  # the one Selection of the draw in progress
    lock: threading.RLock = field(default_factory=threading.RLock)  # a click's draw (and journey) beside the stream's
    _trail: Trail | None = None  # what the journey has read of this view's events (stages.Trail)
    lang: str = "en"  # the language of the panels' words: its tab's (tabs.Tab keeps it so)

    # --- input -----------------------------------------------------------------------
    def other_choice(self, it: dict) -> str | None:
        """The id of another choice of this view's request that an item belongs to (None: its own)."""
        rid = it.get("request_id")
        if rid is None or self.request_id is None or rid == self.request_id:
            return None
        return rid if rid.startswith(self.request_id + ".") else None

    def add(self, items: list[dict]) -> None:
        for it in items:
            t = it["type"]
            other = self.other_choice(it)
            if other is not None:  # choice i > 0: its text goes to the Choices panel; its trace is not drawn
                if t == "output":
                    self.others.setdefault(other, []).append(it)
                    self.dirty.add("choices")
                    self._maybe_finished()
                continue
            if t == "output":
                self.outputs.append(it)
                if it.get("token_id", -1) >= 0:
                    self.token_seen_at.append(time.perf_counter())
                self.dirty.update(("answer", "tokens", "choices") if self.n > 1 else ("answer", "tokens"))
                if it["finished"]:
                    self.own_done = True
                    self._maybe_finished()
                continue
            if t == "error":
                self.error = it["message"]
                self.dirty.add("answer")
                continue
            j = viz.pool_engine(it)
            if j is not None:  # a pool drawn, not an event of the request's own to list
                if j == 0:
                    self.pool = viz.apply_kv_pool(self.pool, it)
                else:  # disaggregated, decode engine j > 0: a pool of its own (block ids of another pool)
                    self.decode_pools[j] = viz.apply_kv_pool(self.decode_pools.get(j), it)
                self.dirty.add("kv")
                continue
            if t == "trace.truncated":
                self.truncated = it
                self.dirty.update(CAPTURED)
            if t == "trace.truncated" and self.validation and self.validation.get("ok") and \
                    not any(c[0] == "trace" for c in self.validation["checks"]):  # (a replay says so already)
                note = truncation_note(it)
                self.validation = {**self.validation,  # a warning: the captures froze
                                   "checks": list(self.validation["checks"]) + [("trace", None, note)]}
                self.dirty.add("request")
            self.events.append(it)
            _keep(self.by_type.setdefault(t, []), it)
            if t.startswith("kv."):
                self.dirty.add("kv")
            self.dirty.update(FEEDS.get(t, ()))

    def _maybe_finished(self) -> None:
        """Finished once choice 0 and every other choice asked for have ended."""
        ended = sum(1 for outs in self.others.values() if outs and outs[-1].get("finished"))
        if self.own_done and ended >= self.n - 1 and not self.finished:
            self.finished = True
            self.dirty.update(PANELS)

    def choice_outputs(self) -> list[list[dict]]:
        """Each choice's outputs, choice 0 first (by the index in "<id>.i")."""
        rest = sorted(self.others.items(), key=lambda kv: int(kv[0].rsplit(".", 1)[-1]))
        return [self.outputs] + [outs for _, outs in rest]

    def kv_pool(self) -> dict | None:
        """The pool the KV panel draws: the one engine's, or (disaggregated) the decode engine's
        that holds this request's pages."""
        j = self.decode_engine()
        return self.pool if j == 0 else self.decode_pools.get(j)

    def decode_engine(self) -> int:
        """The decode engine holding this request's pages (0: the one engine)."""
        return viz.decode_engine_of(self.by_type.get("kv.transfer", []) + self.by_type.get("kv.alloc", []))

    def set_pool(self, pool: dict) -> None:
        """Start from this pool (the view's own copy: kv.pool events are folded into it)."""
        self.pool = pool
        self.dirty.add("kv")

    def select(self, position: int | None) -> None:
        """Select the pass that read the token at `position` (None: the newest pass); every
        panel of SELECTED shows it at its next draw."""
        self.position = None if position is None or position < 0 else int(position)
        self.dirty.update(SELECTED)

    def select_head(self, layer: int, head: int) -> None:
        """The layer and head the attention map (and the MoE table's layer) show."""
        self.layer, self.head = int(layer), int(head)
        self.dirty.update(("attention", "moe"))

    def selection(self) -> Selection:
        """The selected pass: while a draw is under way the one it pinned (every panel of that
        draw shows the same pass, whatever arrives meanwhile)."""
        return self._pinned if self._pinned is not None else self._select()

    def _select(self) -> Selection:
        tok = self.first("tokenize")
        if tok is None:  # capture level off: no prompt pieces, but the usage counts them once it ended
            n_prompt = int(((self.finish_info() or {}).get("usage") or {}).get("prompt_tokens") or 0)
            if not n_prompt:  # positions unknown yet: no pass named (an answer index is not a position)
                return select_pass((), lang=self.lang)
            return select_pass([""] * n_prompt + [self.piece(t) for t in self.generated_ids()], self.position,
                               n_prompt, self.lang)
        # the lens's newest pass, until the trace's end brings every token's lens (or a byte cap stopped them)
        lens = self.by_type.get("logit_lens") if self.live and self.truncated is None and self.first("finish") is None \
            else None
        return newest_with_lens(select_pass(self.labels(), self.position, tok["count"], self.lang),
                                max(e["position"] for e in lens) if lens else None)

    def frozen(self, name: str) -> str:
        """The warning in a panel's header when the trace's byte cap stopped its captures."""
        if self.truncated is None or name not in CAPTURED:
            return ""
        t, what = CAPTURED[name]
        ends = [last_position(e) for e in self.by_type.get(t, ())]
        return frozen_html(self.truncated, max(ends) if ends else None, self.labels(), what, self.lang)

    def first(self, t: str) -> dict | None:
        evs = self.by_type.get(t)
        return evs[0] if evs else None

    # --- derived -------------------------------------------------------------------------
    def labels(self) -> list[str]:
        """Token text by position: the prompt's pieces, then the generated tokens."""
        tok = self.first("tokenize")
        labels = [t["text"] or t["piece"] for t in tok["tokens"]] if tok else []
        return labels + [self.piece(t) for t in self.generated_ids()]

    def generated_ids(self) -> list[int]:
        return [o["token_id"] for o in self.outputs if o.get("token_id", -1) >= 0]

    def token_steps(self) -> int:
        """How many engine steps drew this request's tokens (every choice's), as its outputs name
        them: at capture level off, the steps a replay has (Recording.steps)."""
        return len({o["step"] for outs in self.choice_outputs() for o in outs
                    if o.get("token_id", -1) >= 0 and o.get("step") is not None})

    def pieces(self) -> dict[int, str]:
        ids = set(self.generated_ids())
        for s in self.by_type.get("sample", ()):
            ids.update(s["candidates"])
        # a round's own token is None where the answer ended on an accepted proposal
        ids.update(s["token"] for s in self.by_type.get("spec", ()) if s["token"] is not None)
        return {i: self.piece(i) for i in ids}

    def stream_tokens(self) -> list[dict]:
        """Per-token timing: from `token` events when traced, else from the outputs."""
        evs = self.by_type.get("token")
        if evs:
            return evs
        out, prev = [], 0.0
        for o in self.outputs:
            if o.get("token_id", -1) >= 0:
                out.append({"index": o["index"], "token_id": o["token_id"], "text": o["text"], "t": o["t"],
                            "latency": o["t"] - prev, "ts": o["t"]})
                prev = o["t"]
        return out

    @property
    def level(self) -> str:
        """The request's capture level: its body's, else its arrival event's (an API request)."""
        arrive = self.first("request.arrive")
        return (self.body or {}).get("trace_level") or (arrive or {}).get("trace_level") or "full"

    def finish_info(self) -> dict | None:
        """How the request ended: its `finish` event, or (capture level off: no events) what its
        last output says, the usage included. None while it runs."""
        fin = self.first("finish")
        if fin is not None:
            return fin
        last = self.outputs[-1] if self.outputs and self.outputs[-1]["finished"] else None
        if last is None:
            return None
        return {"reason": last.get("finish_reason"), "usage": last.get("usage"),
                "text": "".join(o["text"] for o in self.outputs)}

    def state(self) -> str:
        """"idle" (nothing sent), "streaming", "replay" (a recording before its end) or "done"."""
        if self.request_id is None and self.validation is None:
            return "idle"
        if self.finished or self.error or (self.validation or {}).get("ok") is False:
            return "done"
        return "replay" if self.replaying else "streaming"

    def missing(self, name: str) -> str | None:
        """Why a panel has nothing to draw when its request does not record that stage."""
        return words.missing(self.lang, name, self.level)

    def ran_no_step(self) -> bool:
        """Ended before any engine step ran it (stopped while it waited), as its trace shows
        (at capture level off no step is recorded: unknown, False)."""
        return self.finish_info() is not None and not self.generated_ids() and "request.arrive" in self.by_type \
            and not self.by_type.get("schedule.step")

    # --- output --------------------------------------------------------------------------
    def render(self, name: str) -> str:
        m, lang = self.model, self.lang
        idle = self.state() == "idle"
        if name == "request":
            return viz.request_html(self.body, self.validation, preview=idle, lang=lang)
        if name == "choices":
            asked = (self.body or {}).get("n")
            if self.n == 1 and isinstance(asked, int) and asked > 1:  # a replay or a watched request: choice 0's trace
                return viz.not_recorded(words.t(lang, words.CHOICES_TITLE, n=asked), words.t(
                    lang, words.CHOICES_OF_ONE, n=asked, id=self.request_id or words.t(lang, words.ITS_ID)))
            return choices_html(self.choice_outputs(), self.n, lang=lang)
        if name == "answer":
            note = ""
            if self.level == "off" and not idle:
                note = words.t(lang, words.OFF_ANSWER, off=words.t(lang, words.NOT_RECORDED["off"]))
            return viz.answer_html(self.stream_tokens(), self.finish_info(), self.error, self.state(), note,
                                   self.piece, lang=lang)
        if idle and name in words.IDLE:
            return viz.not_recorded(*(words.t(lang, x) for x in words.IDLE[name]))
        if name in words.NEVER_RAN and not self.has_input(name) and self.ran_no_step() and \
                (name != "moe" or m["is_moe"]) and (name != "spec" or (m["has_draft"] and self.speculative)):
            why = (self.finish_info() or {}).get("reason") or "stopped"
            return viz.not_recorded(*words.never_ran(lang, name, why))
        missing = None if idle else self.missing(name)
        if missing and not self.has_input(name):
            if name == "moe" and not m["is_moe"]:
                return viz.moe_html([], is_moe=False)  # nothing to record at any level
            return viz.not_recorded(words.t(lang, words.TITLES[name]), missing)
        if name == "prefix":
            fin = self.finish_info()
            return viz.prefix_cache_html(self.first("prefix_cache.lookup"), m["block_size"],
                                         usage=(fin or {}).get("usage") if self.level == "off" else None,
                                         traced=self.level != "off", ended=fin is not None, lang=lang)
        if name == "tokens":
            gen = [{"id": i, "text": self.piece(i), "special": self.is_special(i)} for i in self.generated_ids()]
            if self.level == "off":
                usage = (self.finish_info() or {}).get("usage") or {}
                return viz.tokens_html(None, gen, usage.get("prompt_tokens"), words.t(lang, words.OFF_TOKENS),
                                       lang=lang)
            return viz.tokens_html(self.first("tokenize"), gen, lang=lang,
                                   ids_sent=viz.id_prompt(self.body) is not None)
        if name == "embedding":
            return viz.embedding_html(self.by_type.get("embed", []), m.get("vocab_size"), m.get("hidden_size"),
                                      selection=self.selection(), frozen=self.frozen(name), lang=lang)
        if name == "attention":
            return viz.attention_html(self.by_type.get("attention", []), self.layer, self.head, self.labels(),
                                      m["sliding_windows"] if any(m["sliding_windows"]) else None,
                                      selection=self.selection(), frozen=self.frozen(name), lang=lang)
        if name == "kv":
            # disaggregated (engine/disagg): the pool of the decode engine this request decoded on
            kv = viz.engine_kv_events(self.events, self.decode_engine())
            usage = (self.finish_info() or {}).get("usage")  # the last token drawn is never fed back: no K/V
            held = usage["prompt_tokens"] + usage["completion_tokens"] - 1 if usage and usage["completion_tokens"] \
                else None  # (no token drawn: stopped before its prefill ended, it kept no K/V to speak of)
            return viz.kv_grid_html(self.kv_pool(), self.request_id, kv, m, held, selection=self.selection(),
                                    table_recorded=self.level != "off", lang=lang)
        if name == "moe":
            return viz.moe_html(self.by_type.get("moe", []), self.layer, self.labels(), m["is_moe"],
                                selection=self.selection(), frozen=self.frozen(name), lang=lang)
        if name == "sampling":
            return viz.sampling_html(self.by_type.get("sample", []), self.pieces(), vocab_size=m.get("vocab_size"),
                                     selection=self.selection(), lang=lang)
        if name == "spec":
            if not self.by_type.get("spec") and not m["has_draft"]:
                return viz.not_recorded(words.t(lang, words.TITLES["spec"]), words.t(lang, words.NO_DRAFT))
            if not self.by_type.get("spec") and not self.speculative:
                return viz.not_recorded(words.t(lang, words.TITLES["spec"]), words.t(lang, words.SPEC_OFF))
            sel = self.selection()
            return viz.spec_html(self.by_type.get("spec", []), self.speculative and m["has_draft"], self.pieces(),
                                 selection=sel, picked=self.selected_round(sel), lang=lang)
        if name == "parallel":
            apart = self.by_type.get("kv.transfer")  # disaggregated (engine/disagg): the handover beside it
            return viz.parallel_html(self.by_type.get("schedule.collective", []), m, self.level, idle, lang) + \
                (viz.disagg_html(apart + self.by_type.get("finish", []), lang) if apart else "")
        if name == "logit_lens":
            return viz.logit_lens_html(self.by_type.get("logit_lens", []), labels=self.labels(),
                                       selection=self.selection(), frozen=self.frozen(name), lang=lang)
        if name == "timeline":
            if self.level == "off":
                return viz.untraced_timeline_html(self.stream_tokens(), self.finished, steps=self.token_steps(),
                                                  lang=lang)
            return viz.timeline_html(self.events, self.request_id or "", lang)
        raise KeyError(name)

    def due(self, now: float, force: bool = False) -> list[str]:
        """Dirty panels whose redraw is due (all dirty ones when forced); the ONE_PASS panels
        all together or none (one_pass_due)."""
        group = set(self.one_pass_due(now, force))
        return [n for n in PANELS if n in group or (n not in ONE_PASS and n in self.dirty and (
            force or now - self.drawn_at.get(n, 0.0) >= HEAVY.get(n, 0.0)))]

    def one_pass_due(self, now: float, force: bool = False) -> list[str]:
        """The ONE_PASS panels to redraw now: none before the group's time is up (or a panel's first
        content came: shown at once), then every one that is dirty or shows another pass than the
        selection now (the newest token moved it)."""
        read = self._select().read
        stale = [n for n in ONE_PASS if n in self.dirty or (self.has_input(n) and self.drawn_pass.get(n, -1) != read)]
        first = any(n not in self.drawn_at and self.has_input(n) for n in stale)
        if not stale or not (force or first or now - self.drawn_at.get("one_pass", 0.0) >= ONE_PASS_EVERY):
            return []
        return stale

    def draw(self, names: list[str], now: float) -> dict[str, str]:
        out = {}
        with self.lock:
            return self._draw(names, now, out)

    def _draw(self, names: list[str], now: float, out: dict[str, str]) -> dict[str, str]:
        self._pinned = self._select()  # one selection for every panel of this draw
        try:
            for n in names:
                out[n] = self.drawn[n] = self.render(n)
                self.dirty.discard(n)
                if n in ONE_PASS:
                    self.drawn_pass[n] = self._pinned.read
                if self.has_input(n):  # a placeholder does not count: first content shows at once
                    self.drawn_at[n] = now
                    if n in ONE_PASS:
                        self.drawn_at["one_pass"] = now
            if any(n in ONE_PASS for n in names):
                self.shown_read = self._pinned.read
        finally:
            self._pinned = None
        return out

    def trail(self) -> Trail:
        """The journey's fold of this view's events (journey() reads only those added since its
        last call: the stages' words are re-read several times a second while a request streams)."""
        if self._trail is None or self._trail.request_id != (self.request_id or ""):
            self._trail = Trail(self.request_id or "")
        return self._trail

    def selected_round(self, sel: Selection) -> int | None:
        """The speculative round (index in this request's spec events) whose verify step made the
        token the selected pass predicted; None: no round made it (the prefill, a plain step)."""
        gen = [o for o in self.outputs if o.get("token_id", -1) >= 0]
        i = None if sel.read is None else sel.read + 1 - sel.n_prompt
        if i is None or not 0 <= i < len(gen) or gen[i].get("step") is None:
            return None
        return next((j for j, r in enumerate(self.by_type.get("spec", ())) if r["step"] == gen[i]["step"]), None)

    NEEDS = {"prefix": "prefix_cache.lookup", "tokens": "tokenize", "embedding": "embed", "attention": "attention",
             "moe": "moe", "sampling": "sample", "spec": "spec", "logit_lens": "logit_lens"}  # panel -> the event it draws from

    def has_input(self, name: str) -> bool:
        """Does the panel have anything of this request to draw yet?"""
        if name in self.NEEDS and self.NEEDS[name] in self.by_type:
            return True
        if name in self.NEEDS and name != "tokens":
            return False
        if name == "kv":
            return self.kv_pool() is not None
        if name == "answer":
            return bool(self.outputs) or self.error is not None
        if name == "timeline":
            return bool(self.events) or bool(self.outputs)  # level off: the streamed tokens' times
        if name == "choices":
            return self.n > 1 and bool(self.outputs or self.others)
        if name == "tokens":
            return bool(self.outputs)
        return True


def last_position(e: dict) -> int:
    """The newest position a capture event holds (a lens event: the token it predicted)."""
    if "position" in e:
        return e["position"]
    if "q_start" in e:
        probs = e["probs"]
        rows = probs["shape"][-2] if isinstance(probs, dict) else len(probs[0])
        return e["q_start"] + rows - 1
    return e["start"] + len(e.get("token_ids") or e.get("experts") or [None]) - 1


def truncation_note(truncated: dict | None, dropped: int = 0) -> str:
    """What a bounded trace left out, in words ("" when nothing): a recording's `truncated`, or
    the live `trace.truncated` event (which cannot yet count what it leaves out)."""
    parts = []
    if truncated:
        parts.append(f"truncated: at engine step {truncated['step']} the trace reached the server's cap of "
                     f"{truncated.get('limit_bytes', 0) / 2**20:.3g} MiB per request, so the attention, embedding "
                     "and MoE captures stop there"
                     + (f" ({truncated['captures_dropped']:,} left out)" if "captures_dropped" in truncated else ""))
    if dropped:
        parts.append(f"{dropped:,} later events not kept")
    return "; ".join(parts)
