"""Each browser tab's state (`Tab`), kept by Gradio session hash (`Sessions`)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from app.page.live_view import LiveView
from app.page.stages import JourneyClock
from app.serving.engine_service import EngineService
from app.serving.recording import ReplayCursor

MAX_SESSIONS = 64
MAX_LANGS = 4096
_LANG: OrderedDict[str, str] = OrderedDict()  # session -> its language (the switch's, or its load's)


def lang_of(key: str) -> str:
    """The language of the tab `key` (English until its load says otherwise)."""
    return _LANG.get(key, "en")


def set_lang(key: str, lang: str) -> None:
    _LANG[key] = lang
    _LANG.move_to_end(key)
    while len(_LANG) > MAX_LANGS:
        _LANG.popitem(last=False)


@dataclass
class Tab:
    """One browser tab: the view its panels show, and its recording once there is one."""
    view: LiveView
    cursor: ReplayCursor | None = None
    watched: bool = False  # the view follows someone else's request: Stop must not abort it
    service: EngineService | None = None  # the engine of the request shown (None: a loaded trace)
    clock: JourneyClock = field(default_factory=JourneyClock)
    locked: bool = False  # the controls show a replayed or watched request: read-only
    replaced: bool = False  # a second Send stopped its request: its stream ends without its last updates
    key: str = ""  # its session (Sessions.put): the stages' words speak its language

    @property
    def lang(self) -> str:
        return lang_of(self.key)

    def __setattr__(self, name: str, value) -> None:
        # its view's panels speak the tab's language: given to each view the tab shows, once its key is known
        super().__setattr__(name, value)
        if name in ("view", "key") and getattr(self, "key", "") and getattr(self, "view", None) is not None:
            self.view.lang = lang_of(self.key)


class Sessions:
    """Each browser tab's state, by Gradio session hash (bounded, oldest out); which tabs have
    a Send in flight (one at a time: a second stops the first, then goes), and which are watching."""

    def __init__(self) -> None:
        self._tabs: OrderedDict[str, Tab] = OrderedDict()
        self._lock = threading.Lock()
        self._released = threading.Condition(self._lock)  # a tab's Send slot came free
        self._sending: dict[str, str] = {}  # tab -> the request its Send is streaming ("" until it has an id)
        self.watching: set[str] = set()
        self.refused: set[str] = set()  # tabs whose Send was refused while their request streamed

    def claim(self, key: str) -> str | None:
        """Take the tab's one Send slot: None when taken now, else what holds it."""
        with self._lock:
            if key in self._sending:
                return self._sending[key]
            self._sending[key] = ""
            return None

    def sending(self, key: str, request_id: str) -> None:
        with self._lock:
            if key in self._sending:
                self._sending[key] = request_id

    def release(self, key: str) -> None:
        with self._lock:
            self._sending.pop(key, None)
            self._released.notify_all()

    def wait_free(self, key: str, timeout_s: float) -> None:
        """Until the tab's Send slot is free, or timeout_s passed (then claim() says who holds it)."""
        with self._lock:
            self._released.wait_for(lambda: key not in self._sending, timeout_s)

    def put(self, key: str, tab: Tab) -> None:
        tab.key = key
        with self._lock:
            self._tabs[key] = tab
            self._tabs.move_to_end(key)
            while len(self._tabs) > MAX_SESSIONS:
                self._tabs.popitem(last=False)

    def get(self, key: str) -> Tab | None:
        with self._lock:
            return self._tabs.get(key)


def key_of(request) -> str:
    return getattr(request, "session_hash", None) or "default"
