"""In Chromium: a lab result added to a room the class already follows: the presenter's and a
follower's screens pick up the new stage count by themselves, and the presenter moves the
class onto the result."""
import pytest
from fastapi import FastAPI

from app.classroom.lab_stage import add_to_room, open_room
from app.classroom.rooms import Classrooms
from app.classroom.routes import add_classroom_routes
from app.page.lab_tab import add_lab_routes
from benchmarks.local_server import LocalServer
from tests.app.lab.test_classroom_stage import result
from tests.browser_utils import browser_or_skip, chromium

pytestmark = pytest.mark.slow  # a browser


def test_the_class_sees_a_stage_added_to_its_room():
    browser_or_skip()
    rooms, api = Classrooms(), FastAPI()
    add_classroom_routes(api, rooms, "", lambda rid: None)
    add_lab_routes(api)
    room = open_room(rooms, result("First", "the first result"))
    with LocalServer(None, app=api) as srv, chromium() as browser:
        base = srv.url.rstrip("/")
        teacher = browser.new_context().new_page()
        student = browser.new_context().new_page()
        teacher.goto(f"{base}/classroom/{room.room_id}?key={room.key}")
        student.goto(f"{base}/classroom/{room.room_id}")
        for p in (teacher, student):
            p.wait_for_function("document.body.innerText.includes('the first result')", timeout=20000)
            assert p.locator(".tt-class-dot").count() == 1
        add_to_room(rooms, f"/classroom/{room.room_id}?key={room.key}", result("Second <b>", "measured: 3 blocks"))
        for p in (teacher, student):  # a new count: the page reloads with two stages
            p.wait_for_function("document.querySelectorAll('.tt-class-dot').length === 2", timeout=20000)
        teacher.click(".tt-class-dot[data-i='1']")
        student.wait_for_function("document.body.innerText.includes('measured: 3 blocks')", timeout=20000)
        assert "Experiment: Second <b>" in student.inner_text("#tt-class-title")
