"""Classroom mode: one request walked through stage by stage on a projector. This module
holds the rooms (their state); app/classroom/routes.py serves them.

A room holds one recording (a finished request, a loaded trace, or a request still
streaming, re-read while it runs). The presenter's link carries a secret key and
moves the stage (buttons or keyboard); every other viewer of the room's link follows by
server-sent events (Feed): a lecture hall costs one encoded state per
change, each stage's HTML rendered once per trace version and served from a cache, and
nothing on the engine's thread. The stages are the page's journey (journey()), in
its order and with its words. The presenter may ask "predict the next token" at any answer
position (Question); until its reveal every stage is drawn from the trace as it
stood before that token was drawn (hide_from), so nothing shows it early. The
presenter also picks the position, layer and head that every screen's panels show. The page is
plain HTML + a little JS (not Gradio).
"""
from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Callable

from starlette.concurrency import run_in_threadpool

from app.classroom.cut_panels import cut_panel
from app.classroom.mask import CUT, first_answer_position, generated, hide_from, prompt_tokens
from app.classroom.push import Feed
from app.page.code_panel import code_views, with_code
from app.classroom.question import NO_QUESTION, OPEN_FIRST, Question, VoteRefused
from app.serving.recording import Recording, ReplayCursor
from app.classroom.tongue import Tongue, panel_html
from visualizers import i18n
from visualizers._html import esc
from visualizers.journey import Stage, journey

REFRESH_EVERY = 0.5  # seconds between re-reads of a request that is still running
MAX_ROOMS = 64
MAX_QUESTIONS = 100  # the export keeps this many of a room's questions (the newest)
VOTE_FLUSH = 0.5  # seconds: the running count of votes reaches the class at most this often
TICK_IDLE = 30.0  # seconds a live room keeps re-reading its request with nobody following


@dataclass
class Room:
    room_id: str
    key: str  # the presenter's secret
    rec: Recording
    refresh: Callable[[], Recording | None] | None = None  # re-reads a live request's trace
    stage: int = 0
    version: int = 0  # bumps when anything a follower sees changes (stage, trace, question)
    trace_version: int = 0  # bumps when the stages' HTML changes: the trace grew, the mask or the pick moved
    question: Question | None = None
    ask_at: int | None = None  # the position the class predicts (None: the first answer token)
    revealed: bool = False  # the token at ask_at has been revealed: nothing is hidden any more
    pick: dict = field(default_factory=lambda: {"position": None, "layer": 0, "head": 0})  # what the panels show
    code_open: bool = False  # the presenter opened the stage's code: every screen opens it (classroom.js)
    questions: list[Question] = field(default_factory=list)  # every question asked, for the export
    extra: list = field(default_factory=list)  # stages after the journey (an experiment's result): a Stage,
    # or lang -> Stage (app/classroom/lab_stage.py: drawn in each screen's language)
    with_journey: bool = True  # False: the extra stages alone (app/classroom/lab_stage.py)
    skipped: list[str] = field(default_factory=list)  # the titles of the stages this request skips
    langs: set[str] = field(default_factory=lambda: {i18n.DEFAULT})  # the languages its screens asked for
    feed: Feed = field(default_factory=Feed)
    _stages: list[Stage] = field(default_factory=list)  # in English (the count and the export read them)
    _tongues: dict[str, Tongue] = field(default_factory=dict)  # language -> its stages, once per trace version
    _skip_mask: list[bool] = field(default_factory=list)  # the journey's stages this request skips
    _shown: Recording | None = None  # rec as the class may see it (cut before a hidden token)
    _hidden: int | None = None  # the position _shown hides from (None: nothing hidden)
    _html: dict[tuple[str, int], bytes] = field(default_factory=dict)  # (language, stage) -> its JSON body
    _read_at: float = 0.0
    _ticker: asyncio.Task | None = None
    _vote_flush: bool = False
    _vote_flush_pending: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    on_change: Callable[["Room"], None] | None = None  # told of every state change (app/classroom/lasting.py)

    def __post_init__(self) -> None:
        self._read_at = time.monotonic()  # the trace it was made with is fresh

    @property
    def finished(self) -> bool:
        return any(e["type"] == "finish" for e in self.rec.events)

    @property
    def live(self) -> bool:
        return self.refresh is not None and not self.finished

    def update(self) -> bool:
        """Re-read a running request (at most every REFRESH_EVERY seconds); build stages once.
        True when the trace grew."""
        grew = False
        with self.lock:
            if self.live and time.monotonic() - self._read_at > REFRESH_EVERY:
                self._read_at = time.monotonic()
                rec = self.refresh()
                if rec is not None and len(rec.events) != len(self.rec.events):
                    # (the old stages stay readable until the new ones are in: a reader never counts none)
                    self.rec, self._html = rec, {}
                    self._build()
                    self.version, self.trace_version, grew = self.version + 1, self.trace_version + 1, True
            if not self._stages:
                self._build()
        return grew

    def _build(self) -> None:
        """The stages as the class may see them: from the recording cut before the question's
        token until its reveal, with the presenter's pick (under the lock). English here; another
        language's on its first screen (tongue), from the same cut."""
        at = self.question_position()
        self._shown = self.rec if self.revealed else hide_from(self.rec, at, asked=self.ask_at is not None)
        self._hidden = None if self._shown is self.rec else at
        # the stages this request has, as the page's map lists them: those the whole request skips (no
        # draft, one device) are one line, not stages; read from the whole request, so that the count
        # stays the same from the cut to the reveal
        stages = self._journey(i18n.DEFAULT)
        whole = stages if self._shown is self.rec or not stages else journey(
            self.rec.model, self.rec.request_id, self.rec.body, self.rec.events, self.rec.outputs)
        mask = [w.skipped for w in whole]
        if self.refresh is not None and len(self._skip_mask) == len(mask):
            # a room of a running request never drops a stage it listed (a draft's stage with no
            # round is skipped only at the trace's end): its screens' count and dots do not move
            mask = [now and before for now, before in zip(mask, self._skip_mask)]
        self._skip_mask = mask
        self._tongues = {}
        english = self._tongue(i18n.DEFAULT, stages)
        self._stages, self.skipped = english.stages, english.skipped
        self.stage = min(self.stage, len(self._stages) - 1)

    def _journey(self, lang: str) -> list[Stage]:
        shown = self._shown
        if not self.with_journey:
            return []
        # with_code: what ran, beside each stage's code (the page's code panel)
        return with_code(journey(shown.model, shown.request_id, shown.body, shown.events, shown.outputs,
                                 self._kv_peak(), shown.truncated, position=self.shown_position(),
                                 hidden_from=self._hidden, layer=int(self.pick["layer"]), lang=lang),
                         shown.model, shown.events, shown.request_id, self.shown_position(), int(self.pick["layer"]),
                         lang)

    def _kv_peak(self) -> dict | None:
        cursor = ReplayCursor(self._shown)
        return cursor.goto(cursor.peak_kv_frame()).kv_pool()

    def _tongue(self, lang: str, stages: list[Stage] | None = None) -> Tongue:
        """The stages in `lang` (numbered, the skipped ones a line, the extra ones after), built once
        per trace version however many screens read that language (under the lock)."""
        if lang not in self._tongues:
            stages = self._journey(lang) if stages is None else stages
            kept = [s for s, skip in zip(stages, self._skip_mask) if not skip]
            numbered = [replace(s, title=f"{i} · {s.title.split(' · ', 1)[-1]}") for i, s in enumerate(kept, 1)]
            extra = [x(lang) if callable(x) else x for x in self.extra]
            skipped = [s.title.split(" · ", 1)[-1] for s, skip in zip(stages, self._skip_mask) if skip]
            self._tongues[lang] = Tongue(numbered + extra, skipped)
        return self._tongues[lang]

    def question_position(self) -> int:
        return self.ask_at if self.ask_at is not None else first_answer_position(self.rec)

    def shown_position(self) -> int | None:
        """The token the panels select: the presenter's pick; else, once revealed, the question's
        pass (the one that read the token before it); else the newest pass. Never one whose
        pass predicted a hidden token."""
        pos = self.pick["position"]
        if pos is None and self.revealed:
            pos = self.question_position() - 1
        if pos is not None and self._hidden is not None:
            pos = min(pos, self._hidden - 2)
        return pos if pos is None or pos >= 0 else None

    def _restage(self) -> None:
        """The mask or the pick moved: every stage is rendered again (under the lock)."""
        self._html = {}
        self.version, self.trace_version = self.version + 1, self.trace_version + 1
        self._build()

    def stage_list(self, lang: str = i18n.DEFAULT) -> list[Stage]:
        if not self._stages:
            self.update()
        if lang == i18n.DEFAULT:
            return self._stages
        with self.lock:
            return self._tongue(lang).stages

    def skipped_in(self, lang: str) -> list[str]:
        """The titles of the stages this request skips, in `lang`."""
        self.stage_list(lang)
        return self.skipped if lang == i18n.DEFAULT else self._tongues[lang].skipped

    def render(self, i: int, lang: str = i18n.DEFAULT) -> str:
        """Stage i: its words, then the page's panels for it at the request's last step."""
        return json.loads(self.stage_body(i, lang))["html"]

    def stage_body(self, i: int, lang: str = i18n.DEFAULT) -> bytes:
        """Stage i in `lang` as the JSON the page reads, rendered once per trace version and
        language (then cached): a hall of one language costs what one screen does."""
        all_stages = self.stage_list(lang)
        with self.lock:
            if (lang, i) not in self._html:
                s = all_stages[i]
                cursor = ReplayCursor(self._shown or self.rec)
                # the pool while the request still held its blocks; every other panel at the end
                views = {p: (self._point(cursor.goto(cursor.peak_kv_frame())) if p == "kv" else None)
                         for p in s.panels}
                html = {p: panel_html(v, p, lang) for p, v in views.items() if v is not None}
                view = self._point(cursor.goto(cursor.last_frame))
                note = view.first(CUT)
                html.update({p: got for p in s.panels if p not in html and (got := cut_panel(view, p, note, lang))})
                shown = [p for p in s.panels if p != "choices" or int((self.rec.body or {}).get("n") or 1) > 1]
                # (one choice: the page's line about the n control is not the class's business)
                body = "".join(f"<div class='tt-class-panel'>{html.get(p) or panel_html(view, p, lang)}</div>"
                               for p in shown)
                page = (f"<h2 id='tt-class-title'>{esc(s.title)}</h2><div class='tt-class-text'>{s.text}"
                        f"</div>{code_views().get(s.key, '')}<div class='tt-class-panels'>{body}</div>")
                self._html[(lang, i)] = json.dumps({"index": i, "count": len(all_stages), "key": s.key,
                                                    "html": page, "version": self.trace_version}).encode()
            return self._html[(lang, i)]

    def _point(self, view):
        """The presenter's pick on a panel's view: its position, layer and head."""
        pos, layer, head = self.shown_position(), int(self.pick["layer"]), int(self.pick["head"])
        if hasattr(view, "select"):  # the page's selection API (one meaning of a pick for every panel)
            view.select(pos)
            view.select_head(layer, head)
        else:
            view.position, view.layer, view.head = pos, layer, head
        return view

    def cached_stage(self, i: int, lang: str = i18n.DEFAULT) -> bytes | None:
        return self._html.get((lang, i))

    def etag(self, i: int, lang: str = i18n.DEFAULT) -> str:
        return f'"{self.room_id}.{self.trace_version}.{lang}.{i}"'

    def prerender(self, lang: str | None = None) -> None:
        """Every stage in `lang` (None: in every language a screen of this room asked for), so that
        no follower ever waits for a render (run off the loop)."""
        for one in ([lang] if lang else sorted(self.langs)):
            self.langs.add(one)
            for i in range(len(self.stage_list(one))):
                self.stage_body(i, one)

    def goto(self, i: int) -> None:
        n = len(self.stage_list())
        with self.lock:
            i = max(0, min(int(i), n - 1))
            if i != self.stage:
                self.stage, self.version = i, self.version + 1
        self.publish()

    def add_stage(self, stage: Stage) -> int:
        """A stage after the others (an experiment's result, app/classroom/lab_stage.py): every
        screen hears the new count and reloads its stage list. -> its index."""
        with self.lock:
            self.extra.append(stage)
            self._restage()
            index = len(self._stages) - 1
        self.publish()
        return index

    # --- the live question --------------------------------------------------------
    def sample_for_question(self, position: int) -> dict | None:
        """The draw of the token at `position` (a verify step's kept tokens have one each)."""
        return next((e for e in reversed(self.rec.events) if e["type"] == "sample" and e.get("candidates")
                     and e["position"] == position), None)

    def ask(self, action: str, position: object = None) -> None:
        """The presenter's "open" (at `position`, an answer token's; default the question's
        position, at first the first answer token), "reveal" or "close" of "predict the next token";
        "show": no question, the hidden answer shown on every stage."""
        with self.lock:
            if action == "open":
                at = self.question_position() if position is None else position
                if isinstance(at, bool) or not isinstance(at, int):
                    raise VoteRefused("position must be an int: an answer token's position", param="position")
                sample = self.sample_for_question(at)
                if sample is None:
                    first, n = first_answer_position(self.rec), len(generated(self.rec))
                    where = (f"answer tokens are at positions {first} to {first + n - 1}" if n else "no answer yet")
                    raise VoteRefused(f"no sampled token with its candidates at position {at} to ask about ({where})",
                                      409, "position")
                qid = self.questions[-1].qid + 1 if self.questions else 1
                self.question = Question.from_sample(qid, sample, self.rec.pieces, context_before(self.rec, at))
                self.questions = self.questions[-(MAX_QUESTIONS - 1):] + [self.question]
                if (at, False) != (self.ask_at, self.revealed):  # the mask moves to it (or names it, at last)
                    self.ask_at, self.revealed = at, False
                    self._restage()
            elif action == "show":  # no question: the whole answer, on every stage
                if self.question is not None and not self.question.revealed:
                    raise VoteRefused(OPEN_FIRST, 409)
                if not self.revealed:
                    self.revealed = True
                    self._restage()
            elif action in ("reveal", "close"):
                if self.question is None:
                    raise VoteRefused(NO_QUESTION, 409)
                if action == "reveal":
                    self.question.revealed = True
                    if not self.revealed:  # every stage now shows the answer, at the pass that drew it
                        self.revealed = True
                        self._restage()
                else:
                    self.question = None
            else:
                raise VoteRefused("action must be \"open\", \"reveal\", \"close\" or \"show\"", param="action")
            self.version += 1
        self.publish()

    def select(self, position: object, layer: object, head: object) -> None:
        """The presenter's pick, shown on every screen: a token position (None: the default
        pass), a layer and a head (clamped to the model's)."""
        m = self.rec.model
        for name, value in (("position", position), ("layer", layer), ("head", head)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise VoteRefused(f"{name} must be a non-negative int" + (" or null" if name == "position" else ""),
                                  param=name)
        pick = {"position": position, "layer": min(int(layer or 0), m["num_layers"] - 1),
                "head": min(int(head or 0), m["num_heads"] - 1)}
        with self.lock:
            if pick != self.pick:
                self.pick = pick
                self._restage()
        self.publish()

    def show_code(self, open_: bool) -> None:
        """The presenter opened (or closed) the code view: every screen follows, on every stage."""
        with self.lock:
            if open_ == self.code_open:
                return
            self.code_open, self.version = open_, self.version + 1
        self.publish()

    def vote(self, voter: str, choice: object, guess: object) -> None:
        with self.lock:
            if self.question is None:
                raise VoteRefused(NO_QUESTION, 409)
            self.question.vote(voter, choice, guess)
        self._vote_flush = True  # the count reaches the followers with the next flush (not one event per vote)

    async def flush_votes(self) -> None:
        """At most one state per VOTE_FLUSH seconds for the running count of votes."""
        await asyncio.sleep(VOTE_FLUSH)
        if self._vote_flush:
            self._vote_flush = False
            with self.lock:
                self.version += 1
            self.publish()

    # --- push ---------------------------------------------------------------------
    def state(self) -> dict:
        q = self.question
        return {"stage": self.stage, "count": len(self.stage_list()), "version": self.version,
                "trace_version": self.trace_version, "finished": self.finished,
                "question": q.public() if q is not None else None, "pick": self.pick_state(),
                "ask_at": self.question_position(), "answer_at": first_answer_position(self.rec),
                "hidden_from": self._hidden, "asked": self._hidden is not None and self.ask_at is not None,
                "code": self.code_open}

    def pick_state(self) -> dict:
        """What every screen says it shows: the pass (the token it read) and the layer and head."""
        pos = self.shown_position()
        label = None
        if pos is not None:
            n = prompt_tokens(self.rec)
            tok = next((e for e in self.rec.events if e["type"] == "tokenize"), None)
            gen = generated(self.rec)
            label = (tok["tokens"][pos].get("text") if tok and pos < n and pos < len(tok["tokens"]) else
                     gen[pos - n]["text"] if 0 <= pos - n < len(gen) else None)
        return {**self.pick, "shown": pos, "text": label}

    def publish(self) -> None:
        self.feed.publish(self.state())
        if self.on_change is not None:
            self.on_change(self)

    def start(self) -> None:
        """From the server's loop: bind the feed; a live request's room re-reads it on a timer
        (one reader per room, however many follow it)."""
        self.feed.bind()
        if not self.feed.event:
            self.publish()
        if self.live and (self._ticker is None or self._ticker.done()):
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        idle = 0.0
        while self.live and idle < TICK_IDLE:
            await asyncio.sleep(REFRESH_EVERY)
            idle = 0.0 if self.feed.followers else idle + REFRESH_EVERY
            if await run_in_threadpool(self.update):
                await run_in_threadpool(self.prerender)
                self.publish()
        if not self.live:
            self.publish()  # finished: say so


def context_before(rec: Recording, position: int, chars: int = 60) -> str:
    """The last tokens before `position` (prompt, then answer), about `chars` characters of them
    (the question's context)."""
    tok = next((e for e in rec.events if e["type"] == "tokenize"), None)
    texts = [t.get("text", "") for t in tok["tokens"]] if tok else []
    texts += [o.get("text", "") for o in generated(rec)]
    out = ""
    for t in reversed(texts[:max(0, position)]):
        if len(out) >= chars:
            break
        out = t + out
    return out


def prompt_tail(rec: Recording, chars: int = 60) -> str:
    """The prompt's last tokens (the context of a question on the first answer token)."""
    return context_before(rec, prompt_tokens(rec), chars)


class Classrooms:
    def __init__(self, max_rooms: int = MAX_ROOMS) -> None:
        self._rooms: OrderedDict[str, Room] = OrderedDict()
        self._lock = threading.Lock()
        self.max_rooms = max_rooms
        self.keeper = None  # a RoomKeeper (app/classroom/lasting.py): rooms written to the database

    def create(self, rec: Recording, refresh: Callable[[], Recording | None] | None = None, **fields) -> Room:
        """fields: Room's own (extra stages, with_journey)."""
        room = Room(secrets.token_urlsafe(6), secrets.token_urlsafe(16), rec, refresh, **fields)
        # every stage rendered now, off any loop and off the engine's thread: followers only read the cache
        threading.Thread(target=room.prerender, name=f"classroom-{room.room_id}", daemon=True).start()
        self.add(room)
        if self.keeper is not None:
            room.on_change = self.keeper.changed
            self.keeper.changed(room)
        return room

    def add(self, room: Room) -> None:
        with self._lock:
            self._rooms[room.room_id] = room
            closed = []
            while len(self._rooms) > self.max_rooms:  # the oldest room closes
                closed.append(self._rooms.popitem(last=False)[0])
        for room_id in closed if self.keeper is not None else ():
            self.keeper.closed(room_id)

    def get(self, room_id: str) -> Room | None:
        with self._lock:
            return self._rooms.get(room_id)
