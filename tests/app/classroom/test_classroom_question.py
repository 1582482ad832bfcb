"""Issue 25 item 8: the classroom in the page's order; "predict the next token" at any answer
position, with that token (and everything after it) hidden from every stage until the reveal;
the presenter's position, layer and head shown on every screen. A real engine's trace
(tests/app/conftest.py's recording: 12 answer tokens), rooms driven without a server."""
from __future__ import annotations

import json

import pytest

from app.classroom.page import page_html
from app.classroom.rooms import Room, context_before
from app.classroom.question import VoteRefused
from visualizers._html import esc, show_piece
from visualizers.journey import KEYS, journey


def bodies(room: Room) -> dict[str, str]:
    return {s.key: json.loads(room.stage_body(i))["html"] for i, s in enumerate(room.stage_list())}


def answer(rec) -> list[dict]:
    return [o for o in rec.outputs if o.get("token_id", -1) >= 0]


def prompt_len(rec) -> int:
    return next(e for e in rec.events if e["type"] == "tokenize")["count"]


def test_the_classroom_walks_the_page_journey_in_its_order(recording):
    """The stages this request has, in the page's order; those it skips (one device) as one line."""
    room = Room("r", "k", recording)
    whole = journey(recording.model, recording.request_id, recording.body, recording.events, recording.outputs)
    assert [s.key for s in room.stage_list()] == [s.key for s in whole if not s.skipped]
    assert room.skipped == [s.title.split(" · ")[1] for s in whole if s.skipped] == ["Beyond one device"]
    assert [s.title.split(" · ")[0] for s in room.stage_list()] == [str(i) for i in range(1, len(KEYS))]
    page = page_html(room, False, "")
    assert f"of {len(KEYS) - 1}\n" in page and "skipped by this request: Beyond one device" in page
    room.ask("open")
    room.ask("reveal")  # the reveal keeps the count: no follower reloads
    assert len(room.stage_list()) == len(KEYS) - 1
    assert KEYS.index("tokens") < KEYS.index("prefix")  # the cache hashes token blocks: tokenize first


def test_nothing_shows_the_asked_token_before_the_reveal(recording):
    n, gen = prompt_len(recording), answer(recording)
    at = n + 4  # the fifth answer token
    room = Room("r", "k", recording)
    assert room.state()["hidden_from"] == n  # before any question: the first answer token is hidden
    room.ask("open", at)
    state = room.state()
    assert state["hidden_from"] == at and state["question"]["position"] == at
    assert state["question"]["context"] == context_before(recording, at)
    html = bodies(room)
    # the tokens and the answer end before the asked token's step; no pass that predicted it is shown
    shown_gen = [o for o in room._shown.outputs if o.get("token_id", -1) >= 0]
    assert len(shown_gen) <= at - n and all(o["index"] < at - n for o in shown_gen)
    assert not any(e.get("position", -1) >= at for e in room._shown.events if e["type"] in ("sample", "logit_lens"))
    assert f"generated: <b>{len(shown_gen)}</b>" in html["tokens"]
    assert f"the answer from position <b>{at}</b> on is hidden until the reveal" in html["answer"]
    for key in ("sampling", "logit_lens"):  # neither the sampling panel's nor the lens's draw of it
        assert f"position {at} ·" not in html[key], key
    for key, text in html.items():
        assert f"(position {at - 1:,}) and predicted" not in text, key
    with pytest.raises(VoteRefused):
        room.ask("open", n - 1)  # a prompt token was never sampled
    room.ask("reveal")
    state = room.state()
    assert state["hidden_from"] is None and state["pick"]["shown"] == at - 1  # the pass that drew it
    html = bodies(room)
    drawn = show_piece(gen[at - n]["text"])
    for key in ("logit_lens", "sampling"):
        assert f"(position {at - 1:,}) and predicted «{drawn}»" in html[key], key
    assert f"position {at} ·" in html["sampling"]  # its panel shows that draw too


def test_the_presenters_pick_is_what_every_screen_shows(recording):
    n = prompt_len(recording)
    room = Room("r", "k", recording)
    room.ask("open", n)
    room.ask("reveal")
    room.select(n + 2, 1, 3)
    state = room.state()
    assert state["pick"]["shown"] == n + 2 and (state["pick"]["layer"], state["pick"]["head"]) == (1, 3)
    assert state["pick"]["text"] == answer(recording)[2]["text"]
    html = bodies(room)
    assert "layer 1 · head 3" in html["layers"]
    if 1 in recording.model["moe_layers"]:  # the words quote the routing of the layer the MoE panel shows
        assert "In layer 1 the router" in html["layers"]
    assert f"(position {n + 2:,}) and predicted" in html["sampling"]
    room.select(None, 99, 99)  # clamped to the model
    assert (room.pick["layer"], room.pick["head"]) == (recording.model["num_layers"] - 1,
                                                        recording.model["num_heads"] - 1)
    with pytest.raises(VoteRefused):
        room.select("3", 0, 0)
    # under a question's mask, a pick past the hidden token falls back before it
    room.ask("close")
    room.ask("open", n + 3)
    room.select(n + 8, 0, 0)
    assert room.state()["pick"]["shown"] == n + 1


def test_a_bundle_holds_the_stages_hidden_and_revealed(recording):
    """A static bundle follows the server's question: its page takes stages/revealed/N.json once
    the server says the token is revealed."""
    import io
    import zipfile

    from app.classroom.bundle import bundle_zip
    room = Room("r", "k", recording)
    with zipfile.ZipFile(io.BytesIO(bundle_zip(room, "http://server", ""))) as z:
        answer = KEYS.index("answer")
        hidden = json.loads(z.read(f"stages/{answer}.json"))["html"]
        shown = json.loads(z.read(f"stages/revealed/{answer}.json"))["html"]
        assert len([n for n in z.namelist() if n.startswith("stages/revealed/")]) == len(room.stage_list())
    assert "is hidden until" in hidden and "is hidden until" not in shown
    assert "It ended because" in shown
    assert room.state()["hidden_from"] is not None  # the room itself still hides it


def test_an_n_request_s_other_choices_are_hidden_until_the_reveal_too(service):
    """n = 2, greedy: choice 1 draws the asked token at the same answer index. The room's cut
    recording holds choice 1's tokens only before that step and index, so its column in the
    Choices panel cannot give the answer away; after the reveal it shows its whole text."""
    import time

    from app.serving.recording import record_request
    from app.serving.requests import build_body
    from tests.service_utils import run_to_end
    body = build_body("m", "Be brief.", "Greedy foxes", 0.0, 0, 1.0, 8, None, False, 1, "full") | {
        "ignore_eos": True, "n": 2}
    rid, _ = run_to_end(service, body)
    end = time.monotonic() + 60
    while not ((tr := service.store.trace(f"{rid}.1")) and tr.outputs and tr.outputs[-1]["finished"]):
        assert time.monotonic() < end, "choice 1 did not finish"
        time.sleep(0.05)
    rec = record_request(service.store, rid, service.model_info(), service.piece, service.is_special)
    assert len(rec.choices) == 1 and len(answer(rec)) == 8
    n, at = prompt_len(rec), prompt_len(rec) + 3
    room = Room("r", "k", rec)
    room.ask("open", at)
    kept = [o for o in room._shown.choices[0] if o.get("token_id", -1) >= 0]
    assert all(o["index"] < at - n for o in kept)
    html = bodies(room)["answer"]
    assert "data-choice='1'" in html  # the panel draws both choices, choice 1 cut too
    assert "streaming" not in html and "the request has ended; the rest is hidden" in html  # not still coming
    whole = esc("".join(o["text"] for o in rec.choices[0]))
    assert whole not in html
    room.ask("reveal")
    assert whole in bodies(room)["answer"]
