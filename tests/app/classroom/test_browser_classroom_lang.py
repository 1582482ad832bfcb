"""Issue 42 item 2 in Chromium: one room, a presenter whose browser speaks Chinese (locale
zh-CN), an English student and a Chinese student on a phone (420 px). The presenter's move
reaches every screen, each drawn in its own language; the Chinese phone's switch turns it to
English at once. Screenshots of the Chinese presenter and phone."""
from __future__ import annotations

import re

import pytest
from fastapi import FastAPI

from app.classroom.rooms import Classrooms
from app.classroom.routes import add_classroom_routes
from app.page.code_panel import add_code_routes
from app.page.layout import CSS
from benchmarks.local_server import LocalServer
from tests.browser_utils import browser_or_skip, chromium

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*no_silent_downcasting")]
HAN = re.compile(r"[\u4e00-\u9fff]")


def stage_is(page, i: int) -> None:
    page.wait_for_function(f"document.body.dataset.stage === '{i}'", timeout=30_000)


def test_each_screen_follows_the_presenter_in_its_own_language(recording, shots):
    browser_or_skip()
    rooms, api = Classrooms(), FastAPI()
    add_classroom_routes(api, rooms, CSS, lambda rid: recording if rid == recording.request_id else None)
    add_code_routes(api)
    room = rooms.create(recording)
    tokens = next(i for i, s in enumerate(room.stage_list()) if s.key == "tokens")
    with LocalServer(None, app=api) as srv, chromium() as browser:
        base = srv.url.rstrip("/")
        teacher = browser.new_context(locale="zh-CN", viewport={"width": 1400, "height": 900}).new_page()
        english = browser.new_context(locale="en-US", viewport={"width": 1200, "height": 800}).new_page()
        phone = browser.new_context(locale="zh-CN", viewport={"width": 420, "height": 860}).new_page()
        teacher.goto(f"{base}/classroom/{room.room_id}?key={room.key}")
        for p in (english, phone):
            p.goto(f"{base}/classroom/{room.room_id}")
        for p in (teacher, english, phone):
            stage_is(p, 0)
        assert teacher.evaluate("document.documentElement.lang") == "zh-CN"
        teacher.click(f".tt-class-dot[data-i='{tokens}']")
        for p in (teacher, english, phone):
            stage_is(p, tokens)
        titles = {k: p.inner_text("#tt-class-title") for k, p in (("zh", teacher), ("en", english), ("phone", phone))}
        assert HAN.search(titles["zh"]) and HAN.search(titles["phone"]) and not HAN.search(titles["en"]), titles
        assert titles["zh"] == titles["phone"]
        assert HAN.search(phone.inner_text("#tt-class-stage .tt-class-text"))  # the stage's sentences too
        assert not HAN.search(english.inner_text("#tt-class-stage .tt-class-text"))
        # nothing wider than the phone: the stage's words and the header wrap
        assert phone.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
        teacher.screenshot(path=str(shots / "classroom-presenter-zh.png"))
        phone.screenshot(path=str(shots / "classroom-phone-zh-420.png"), full_page=False)
        english.screenshot(path=str(shots / "classroom-audience-en.png"))
        # the phone's own switch: English at once, still on the presenter's stage
        phone.click(".tt-class-lang button[data-lang='en']")
        stage_is(phone, tokens)
        phone.wait_for_function("!/[\\u4e00-\\u9fff]/.test(document.querySelector('#tt-class-title').innerText)",
                                timeout=30_000)
        assert room.langs == {"en", "zh_CN"}  # two languages, however many screens
