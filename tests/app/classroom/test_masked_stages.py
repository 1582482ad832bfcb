"""Issue 38 item 3: a classroom's masked stages tell the truth about what they show. Before the
reveal each stage speaks of the request up to the hidden token (speculation on, with its rounds
before the cut; the stream ended, the rest hidden; the steps counted to the cut), names a position
only once a question has set one, and no panel says "streaming" or "not yet" of a finished
request. A real engine's speculative run (tests/app/conftest.py's recording, a tiny draft)."""
from __future__ import annotations

import json
import re

from app.classroom.rooms import Room


def texts(room: Room) -> dict[str, str]:
    return {s.key: s.text for s in room.stage_list()}


def panels(room: Room) -> dict[str, str]:
    return {s.key: json.loads(room.stage_body(i))["html"].split("tt-class-panels", 1)[1]
            for i, s in enumerate(room.stage_list())}


def answer_tokens(rec) -> list[dict]:
    return [o for o in rec.outputs if o.get("token_id", -1) >= 0]


def test_before_any_question_the_stages_describe_the_request_up_to_its_answer(recording):
    assert any(e["type"] == "spec" and e["accepted"] for e in recording.events)  # speculation ran and kept drafts
    room = Room("r", "k", recording)
    said, drawn = texts(room), panels(room)
    assert "Speculative decoding is on for this request" in said["spec"] and "without" not in said["spec"]
    assert "The request has ended" in said["answer"] and "so far" not in said["answer"]
    assert "before the first answer token" in said["batching"] and "in all" not in said["batching"]
    assert "produced the answer so far" not in said["timeline"]
    assert "handed back the moment it finished" in said["kv"]  # not "the moment it finishes"
    assert "● streaming" not in drawn["answer"] and "the request has ended" in drawn["answer"]
    assert "no token sampled yet" not in drawn["sampling"] and "no speculative round yet" not in drawn["spec"]
    # no question yet: no position is named as hidden, on any stage or in the header's state
    hidden = room.state()["hidden_from"]
    assert not room.state()["asked"]
    assert not any(re.search(rf"position (<b>)?{hidden:,}\b", t) for t in said.values())


def test_a_question_s_cut_counts_rounds_steps_and_tokens_before_it(recording):
    n = next(e for e in recording.events if e["type"] == "tokenize")["count"]
    gen = answer_tokens(recording)
    steps = sorted({o["step"] for o in gen})
    cut_step = steps[2]  # the prefill's token, one verify round's, then the asked one's
    at = n + next(i for i, o in enumerate(gen) if o["step"] == cut_step)
    rounds = [e for e in recording.events if e["type"] == "spec" and e["step"] < cut_step]
    mine = [e for e in recording.events if e["type"] == "schedule.step" and e["step"] < cut_step
            and any(x["request_id"] == recording.request_id for x in e["batch"])]
    room = Room("r", "k", recording)
    room.ask("open", at)
    assert room.state()["asked"] and room.state()["hidden_from"] == at
    said, drawn = texts(room), panels(room)
    where = f"before position <b>{at:,}</b>"
    hidden = f"the answer from position <b>{at:,}</b> on is hidden until the reveal"
    assert f"Over <b>{len(rounds)}</b> round" in said["spec"] and where in said["spec"] and hidden in said["spec"]
    assert f"the answer's first <b>{at - n}</b> tokens, {where}" in said["answer"] and hidden in said["answer"]
    assert "The request has ended" in said["answer"]
    assert f"its <b>{len(mine)}</b> engine steps {where}" in said["batching"]
    assert "● streaming" not in drawn["answer"] and f"position {at:,} on is hidden" in drawn["answer"]
    room.ask("reveal")  # the whole request again: its own words
    said = texts(room)
    assert "It ended because" in said["answer"] and "in all" in said["batching"] and "before position" not in \
        said["spec"]


def test_a_token_kept_from_the_hidden_token_s_round_is_not_said_to_come_from_no_round(recording):
    """A verify step keeps several tokens at once: asked at the second token of a round, the class
    sees the first, and the round that drew it is cut with the hidden one. The Speculation panel
    said that token "came from no speculative round (the prefill or a plain decode step)"."""
    n = next(e for e in recording.events if e["type"] == "tokenize")["count"]
    gen = answer_tokens(recording)
    i = next(i for i in range(1, len(gen)) if gen[i]["step"] == gen[i - 1]["step"])  # 2nd token of a round
    room = Room("r", "k", recording)
    room.ask("open", n + i)
    spec = panels(room)["spec"]
    assert "came from no speculative round" not in spec
    assert "came from a verify step that also drew the hidden token" in spec
    room.ask("reveal")  # the whole request: the round is listed, and the token's row is marked
    room.select(n + i - 2, 0, 0)  # the pass that predicted the token the class saw
    assert "verify step (its row marked" in panels(room)["spec"]


def test_the_kv_stage_names_the_step_that_drew_the_hidden_token_as_such(recording):
    """Before any question the cut keeps the prefill (its inputs all came before the hidden token):
    the KV pages stage said "After engine step 1, the last before the hidden token was drawn", of the
    step that drew it. A verify step reads drafts past the cut, so a question inside a round keeps the
    pool of the step before, and that one is the last before."""
    n = next(e for e in recording.events if e["type"] == "tokenize")["count"]
    gen = answer_tokens(recording)
    room = Room("r", "k", recording)
    said = texts(room)["kv"]
    assert f"After engine step {gen[0]['step']}, the one that drew the hidden token" in said, said
    assert "the last before the hidden token was drawn" not in said
    i = next(i for i in range(1, len(gen)) if gen[i]["step"] == gen[i - 1]["step"])  # inside a verify round
    room.ask("open", n + i)
    said = texts(room)["kv"]
    assert "the last before the hidden token was drawn" in said and "the one that drew" not in said, said
