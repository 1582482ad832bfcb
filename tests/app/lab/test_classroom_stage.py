"""A lab result added as a stage to a classroom room the presenter already has open: after
the room's own stages, every screen told the new count; only the presenter's link may add."""
import pytest

from app.classroom.lab_stage import add_to_room, open_room
from app.classroom.rooms import Classrooms
from app.page.lab_tab import LabDesk


def result(title: str, said: str) -> dict:
    """A finished result's dict with no settings (what the stage draws needs no engine run)."""
    return {"experiment": "disaggregation", "title": title, "model": "embedded", "size": "ci", "settings": [],
            "sentences": [said], "cancelled": False, "error": None, "started": "", "seconds": 1.5,
            "machine": {}, "schema": 1}


def test_a_result_becomes_the_last_stage_of_an_open_room():
    rooms = Classrooms()
    room = open_room(rooms, result("First", "the first result"))
    assert len(room.stage_list()) == 1
    before = room.state()["version"]
    got, index = add_to_room(rooms, f"http://127.0.0.1:7860/classroom/{room.room_id}?key={room.key}",
                             result("Second <b>", "measured: 3 blocks"))
    assert got is room and index == 1
    assert [s.key for s in room.stage_list()] == ["experiment", "experiment"]
    state = room.state()
    assert state["count"] == 2 and state["version"] > before  # the screens hear it and reload
    body = room.render(1)
    assert "Experiment: Second &lt;b&gt;" in body and "measured: 3 blocks" in body
    assert "the first result" in room.render(0)
    room.goto(1)
    assert room.state()["stage"] == 1
    # the link as a path works too
    assert add_to_room(rooms, f"/classroom/{room.room_id}?key={room.key}", result("Third", "x"))[1] == 2


@pytest.mark.parametrize("link, why", [
    ("", "presenter link"), ("/classroom/abc", "presenter link"),  # the audience's link: no key
    ("/classroom/nosuchroom?key=k", "no open room"), ("WRONG", "presenter link")])
def test_only_the_presenters_link_adds_a_stage(link, why):
    rooms = Classrooms()
    open_room(rooms, result("First", "one"))
    with pytest.raises(ValueError, match=why):
        add_to_room(rooms, link, result("Second", "two"))


def test_a_wrong_key_is_refused_and_changes_nothing():
    rooms = Classrooms()
    room = open_room(rooms, result("First", "one"))
    with pytest.raises(ValueError, match="not this room's presenter key"):
        add_to_room(rooms, f"/classroom/{room.room_id}?key=guess", result("Second", "two"))
    assert len(room.stage_list()) == 1


def test_the_tab_adds_its_last_result_to_the_room():
    desk = LabDesk(True, classrooms=Classrooms())
    assert "Run an experiment first" in desk.add_to_classroom("tab-a", "/classroom/x?key=y")
    room = open_room(desk.classrooms, result("First", "one"))
    desk.last["tab-a"] = result("Mine <i>", "two")
    said = desk.add_to_classroom("tab-a", f"/classroom/{room.room_id}?key={room.key}")
    assert "tt-lab-stage-added" in said and "Mine &lt;i&gt;" in said and "stage 2 of room" in said
    assert "tt-lab-room-refused" in desk.add_to_classroom("tab-a", f"/classroom/{room.room_id}")


def test_a_result_goes_after_a_requests_journey():
    """A room a presenter opened on a real request: the result comes after its journey's stages."""
    from tests.service_utils import app_service, record_run, started
    with started(app_service(None, model=None)) as svc:
        rec = record_run(svc, "What is a token?", max_tokens=4)
    rooms = Classrooms()
    room = rooms.create(rec)
    journey = [s.key for s in room.stage_list()]
    assert "sampling" in journey and "experiment" not in journey
    room.goto(2)
    _, index = add_to_room(rooms, f"/classroom/{room.room_id}?key={room.key}", result("Batching", "8 requests"))
    assert index == len(journey) and [s.key for s in room.stage_list()] == journey + ["experiment"]
    assert room.state()["count"] == len(journey) + 1 and room.state()["stage"] == 2  # where the class was
    assert "8 requests" in room.render(index) and "Sample" in room.render(journey.index("sampling"))
