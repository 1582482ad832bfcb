"""Issue 42 item 2 in the classroom: each screen's stages in its own language, built once per
trace version and language (not per follower), the presenter's moves the same for every screen.
On a real engine's recording (tests/app/conftest.py's), over the real routes."""
from __future__ import annotations

import io
import json
import re
import zipfile

from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.classroom.lab_stage import LabStage, open_room
from app.classroom.lasting import restored, snapshot
from app.classroom.rooms import Classrooms, Room
from app.classroom.routes import add_classroom_routes
from app.store.room_rows import RoomRow

HAN = re.compile(r"[\u4e00-\u9fff]")


def served(recording) -> tuple[Classrooms, TestClient]:
    """The classroom's routes over one recorded request: (its rooms, a client of them)."""
    rooms, api = Classrooms(), FastAPI()
    add_classroom_routes(api, rooms, "", lambda rid: recording if rid == recording.request_id else None)
    return rooms, TestClient(api)


def test_each_language_is_built_once_per_trace_version_and_served_by_its_own_url(recording):
    rooms, client = served(recording)
    with client:
        made = client.post("/classroom", json={"request_id": recording.request_id}).json()
        room = rooms.get(made["id"])
        zh = client.get(made["audience_url"], headers={"Accept-Language": "zh-CN,zh;q=0.9"}).text
        en = client.get(made["audience_url"] + "?lang=en", headers={"Accept-Language": "zh-CN"}).text
        assert '"lang": "zh-CN"' in zh and re.search(r"<html lang=.zh-CN.", zh)
        assert '"lang": "en"' in en
        assert room.langs == {"en", "zh_CN"}  # the Chinese screen's first load built its stages, once
        n = len(room.stage_list())
        assert len(room.stage_list("zh_CN")) == n  # the same stages, in the same order
        tokens = next(i for i, s in enumerate(room.stage_list()) if s.key == "tokens")
        got = {lang: client.get(f"/classroom/{room.room_id}/stage/{tokens}?v={room.trace_version}&lang={lang}")
               for lang in ("zh-CN", "en")}
        assert got["zh-CN"].headers["etag"] != got["en"].headers["etag"]  # a browser never takes one for the other
        title = {k: json.loads(r.content)["html"].split("</h2>")[0] for k, r in got.items()}
        assert HAN.search(title["zh-CN"]) and not HAN.search(title["en"]), title
        # 300 followers of one language read one body: the same bytes, never drawn again
        again = room.stage_body(tokens, "zh_CN")
        assert again is room.stage_body(tokens, "zh_CN") and again == got["zh-CN"].content
        built = room._tongues["zh_CN"]
        for _ in range(3):
            client.get(f"/classroom/{room.room_id}/stage/{tokens}?lang=zh-CN")
        assert room._tongues["zh_CN"] is built
        # the presenter's move: one state for every screen (no words in it), each screen's stage ready
        key = made["presenter_url"].split("key=")[1]
        moved = client.post(f"/classroom/{room.room_id}/goto", json={"key": key, "stage": tokens + 1}).json()
        assert moved["stage"] == tokens + 1
        assert room.cached_stage(tokens + 1, "zh_CN") is not None and room.cached_stage(tokens + 1) is not None
        # the presenter's bundle: in the presenter's language (a static page has no server to ask)
        zipped = client.get(f"/classroom/{room.room_id}/bundle?key={key}", headers={"Accept-Language": "zh-CN"})
        with zipfile.ZipFile(io.BytesIO(zipped.content)) as z:
            first = json.loads(z.read(f"stages/{tokens}.json"))["html"].split("</h2>")[0]
            assert HAN.search(first) and "<html lang=\"zh-CN\"" in z.read("index.html").decode()
        # a moved mask (a question opened) builds each language again, for the new trace version
        before = room.trace_version
        client.post(f"/classroom/{room.room_id}/question", json={"key": key, "action": "open"})
        assert room.trace_version > before and room._tongues.get("zh_CN") is not built


def test_a_masked_room_hides_the_answer_in_chinese_too(recording):
    room = Room("r", "k", recording)
    answer = next(i for i, s in enumerate(room.stage_list("zh_CN")) if s.key == "answer")
    drawn = room.render(answer, "zh_CN")
    assert "答案先隐藏，直到主讲人请全班预测它" in drawn and "the class sees" not in drawn
    panel = drawn.split("tt-class-panels", 1)[1]
    assert ">Answer<" not in panel and HAN.search(re.sub(r"<[^>]+>", "", panel).split()[0])  # its title too
    assert "the class sees" in room.render(answer)  # the English screen's own words


def result() -> dict:
    return {"experiment": "batching", "title": "Static vs continuous batching", "model": "embedded", "size": "ci",
            "settings": [], "sentences": [], "cancelled": False, "error": None, "started": "", "seconds": 1.5,
            "machine": {}, "schema": 1}


def test_an_experiments_stage_speaks_each_screens_language_and_lasts():
    rooms = Classrooms()
    room = open_room(rooms, result())
    assert room.stage_list()[0].title == "Experiment: Static vs continuous batching"
    assert room.stage_list("zh_CN")[0].title == "实验：静态批处理与连续批处理"
    assert "在本机用时" in room.render(0, "zh_CN") and "on this machine" in room.render(0)
    row = RoomRow(room.room_id, room.key, "", "", snapshot(room))
    back = restored(row, room.rec)
    assert isinstance(back.extra[0], LabStage)
    assert back.stage_list("zh_CN")[0].title == "实验：静态批处理与连续批处理"


def test_a_refused_vote_is_said_in_the_screens_language(recording):
    """The API's refusal stays English (OpenAI's error shape); the Chinese screen shows its words."""
    _, client = served(recording)
    with client:
        made = client.post("/classroom", json={"request_id": recording.request_id}).json()
        refused = client.post(f"/classroom/{made['id']}/vote", json={"choice": 0, "voter": "student-0001"}).json()
        said = refused["error"]["message"]
        assert said == "no question is open"  # the API's words, as every client reads them
        page = client.get(made["audience_url"] + "?lang=zh-CN").text
        start = page.index("const CONFIG = ") + len("const CONFIG = ")
        text = json.JSONDecoder().raw_decode(page, start)[0]["text"]
        assert text[said] == "现在没有开放的问题"
        assert text["guess must be 1 to 40 characters of text"] == "猜测的内容须为 1 到 40 个字符"
