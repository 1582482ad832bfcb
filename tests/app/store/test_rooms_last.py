"""Issue 39 item 3, without a server: a room's state (stage, pick, the question and its votes)
written to the database and loaded back by the same server (host:port) after a "restart" (the
library closed and opened again); its trace named when the library holds it, copied when not;
another server's rooms are not loaded; a change after the restart lasts too. SQLite and PostgreSQL."""
from __future__ import annotations

import json
import threading

from app.classroom.lab_stage import open_room
from app.classroom.lasting import lasting_classrooms
from app.serving.recording import Recording
from app.store.opening import open_library

OWNER = "host:7860"


def _open(db_url, owner=OWNER):
    lines: list[str] = []
    library = open_library(None, db_url, lines.append)
    return library, lasting_classrooms(library, owner, lines.append), lines


def test_rooms_come_back_where_they_stood(db_url, recording):
    library, classrooms, _ = _open(db_url)
    library.add_file(recording)  # the library holds this one: the room names it
    other = Recording.from_json({**recording.to_json(), "id": "uploaded-1"})  # this one it does not
    named, copied = classrooms.create(recording), classrooms.create(other)
    for stage in range(1, 5):  # a burst of moves: coalesced, the last one lasts
        named.goto(stage)
    at = named.question_position()
    named.select(at - 1, 1, 1)
    named.show_code(True)  # every screen shows the stage's code (issue 43)
    named.ask("open")
    named.vote("voter-aaaaaaaa", 1, None)
    named.vote("voter-bbbbbbbb", None, "owls")
    named.publish()  # the vote flush's push
    copied.ask("show")
    result = {"experiment": "prefix", "title": "Prefix <cache>", "model": "tiny", "size": "s", "seconds": 1.0,
              "settings": [], "sentences": ["It <b>helps</b>."]}
    lab = open_room(classrooms, result, {"num_layers": 2, "num_heads": 2})  # an experiment's room
    before, question = named.state(), named.question
    library.close()  # the restart

    library, classrooms, lines = _open(db_url)
    back = classrooms.get(named.room_id)
    assert back is not None and back.key == named.key and classrooms.get(copied.room_id).revealed
    assert any("3 room(s) back" in line for line in lines), lines
    assert classrooms.get(lab.room_id).render(0) == lab.render(0) and "It &lt;b&gt;helps" in lab.render(0)
    after = back.state()
    assert after["stage"] == before["stage"] == 4 and after["pick"] == before["pick"]
    assert after["code"] is before["code"] is True and not classrooms.get(copied.room_id).state()["code"]
    assert after["question"] == before["question"] and after["hidden_from"] == before["hidden_from"]
    assert back.question.votes == question.votes and back.question.shown == question.shown
    assert after["trace_version"] > before["trace_version"]  # no browser takes an old stage for a new one
    assert back.rec.to_json() == recording.to_json()
    back.ask("reveal")
    back.goto(2)
    library.close()

    library, classrooms, _ = _open(db_url, "elsewhere:7860")  # another server on the same database
    assert classrooms.get(named.room_id) is None
    library.close()
    library, classrooms, _ = _open(db_url)
    again = classrooms.get(named.room_id)
    assert again.stage == 2 and again.question.revealed and again.state()["question"]["correct"] is not None
    library.close()


def test_a_room_whose_trace_is_gone_does_not_come_back(db_url, recording):
    library, classrooms, _ = _open(db_url)
    library.add_file(recording)
    room = classrooms.create(recording)
    library.writer.flush()
    library.delete(recording.request_id)
    library.close()
    library, classrooms, lines = _open(db_url)
    assert classrooms.get(room.room_id) is None and any("could not be" in line for line in lines), lines
    library.close()


def test_a_burst_of_moves_is_one_write(db_url, recording):
    """Changes only mark the room: while its write waits, every later move rides on it."""
    library, classrooms, _ = _open(db_url)
    gate = threading.Event()
    library.writer.put(lambda _repo: gate.wait(10))  # the writer busy (a long trace going in)
    room = classrooms.create(recording)
    keeper, saves = classrooms.keeper, []
    real = keeper.repo.save
    keeper.repo.save = lambda row, with_trace: (saves.append(json.loads(row.state)["stage"]), real(row, with_trace))
    for stage in range(1, 6):
        room.goto(stage)
    gate.set()
    assert library.writer.flush(10)
    assert saves == [5]
    library.close()
