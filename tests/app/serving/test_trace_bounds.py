"""A long-running server's traces are bounded: API requests default to capture level
"basic", each request's trace stops keeping tensor captures past a byte cap (and says so,
in the file, the request panel and the classroom), and the store never holds more than its
byte budget in all, dropping the oldest first."""
from __future__ import annotations

import json
import random

import pytest

from app.serving.trace_store import TraceStore, event_bytes
from tests.service_utils import app_service, run_to_end, started

SEP = (",", ":")


def _exact(tr) -> int:
    return len(json.dumps([tr.events, tr.outputs], separators=SEP)) + \
        (len(json.dumps(tr.body, separators=SEP)) if tr.body else 0)


def test_the_store_never_holds_more_than_its_byte_budget():
    cap, budget = 20_000, 100_000
    store = TraceStore(max_requests=1000, max_bytes_per_request=cap, max_total_bytes=budget)
    rng = random.Random(7)
    running: dict[str, int] = {}  # request -> step
    evicted_while_running = set()
    for i in range(3000):
        if len(running) < 4 or rng.random() < 0.01:
            rid = f"r{i}"
            running[rid] = 0
            store.set_body(rid, {"messages": [{"role": "user", "content": "x" * rng.randrange(10, 2000)}]}, "m")
        rid = rng.choice(sorted(running))
        step = running[rid] = running[rid] + 1
        keys = rng.randrange(1, 64)
        store.add(rid, {"type": "attention", "request_id": rid, "step": step, "model": "m",
                        "probs": [[[round(rng.random(), 4)] * keys] * rng.randrange(1, 5)] * 4})
        store.add(rid, {"type": "sample", "request_id": rid, "step": step, "candidates": list(range(8)),
                        "probs": [0.125] * 8})
        done = rng.random() < 0.03
        if done:
            store.add(rid, {"type": "finish", "request_id": rid, "step": step, "reason": "stop"})
        store.add_output(rid, {"type": "output", "request_id": rid, "token_id": 5, "text": "ab", "finished": done,
                               "step": step})
        if done:
            del running[rid]
        kept = store._traces
        assert store.total_bytes <= budget
        assert store.total_bytes == sum(t.size for t in kept.values())
        for r in list(running):
            if r not in kept:
                evicted_while_running.add(r)
    assert len(store.request_ids()) > 3 and evicted_while_running  # it did have to drop some
    for rid in store.request_ids():
        tr = store._traces[rid]
        if tr.packed is not None:
            assert tr.nbytes == _exact(store.trace(rid))  # exact once packed
        assert tr.nbytes <= 2 * cap + 1000  # light events past the cap, up to twice it (plus the finish)
    # a request dropped while it ran does not come back half-recorded
    gone = next(iter(evicted_while_running))
    store.add(gone, {"type": "token", "request_id": gone, "step": 999, "token_id": 1})
    assert gone not in store


def test_a_request_past_its_cap_keeps_its_light_events_and_says_so():
    store = TraceStore(max_bytes_per_request=5_000, max_total_bytes=1_000_000)
    cut_at = []
    for step in range(40):
        if store.add("a", {"type": "attention", "request_id": "a", "step": step, "probs": [[[0.5] * 32] * 2] * 2}):
            cut_at.append(step)
        store.add("a", {"type": "token", "request_id": "a", "step": step, "token_id": step, "text": "x"})
    assert len(cut_at) == 1  # add() says it once: the engine stops computing the captures
    tr = store.trace("a")
    assert tr.truncated == {"limit_bytes": 5_000, "step": cut_at[0], "captures_dropped": 40 - cut_at[0]}
    assert [e["step"] for e in tr.events if e["type"] == "token"] == list(range(40))
    assert max(e["step"] for e in tr.events if e["type"] == "attention") == cut_at[0] - 1
    with pytest.raises(ValueError, match="twice the per-request cap"):
        TraceStore(max_bytes_per_request=10, max_total_bytes=19)


def test_a_cap_met_by_an_older_pass_drops_the_newer_ones_that_came_first():
    """A `full` trace's newest pass is built live, the older ones after: captures come out of
    step order. Where an older pass's capture meets the cap, the store keeps no capture of a
    later pass (the replay's captures end where the note says); its light events stay."""
    store = TraceStore(max_bytes_per_request=5_000, max_total_bytes=1_000_000)
    probs = [[[0.5] * 32] * 2] * 2
    live = [5, 9]  # built at their steps; the others (1-4, 6-8) after, in order
    order = live + [1, 2, 3, 4, 6, 7, 8]
    for step in range(1, 10):
        store.add("a", {"type": "token", "request_id": "a", "step": step, "token_id": step, "text": "x"})
    said = [step for step in order
            if store.add("a", {"type": "attention", "request_id": "a", "step": step, "probs": probs})]
    tr = store.trace("a")
    assert len(said) == 1 and said[0] in (1, 2, 3, 4) and tr.truncated["step"] == said[0]
    kept = sorted(e["step"] for e in tr.events if e["type"] == "attention")
    assert kept == list(range(1, said[0]))
    assert tr.truncated["captures_dropped"] == 9 - len(kept)  # the live ones dropped, and from the cut on
    assert [e["step"] for e in tr.events if e["type"] == "token"] == list(range(1, 10))
    assert store.total_bytes == tr.nbytes == sum(event_bytes(e) for e in tr.events)  # (what it dropped, uncounted)


def test_the_bounds_are_command_line_flags():
    from app.__main__ import parse_args, serve_limits, trace_store
    args = parse_args([])
    store = trace_store(args)
    assert (store.max_bytes, store.max_total_bytes) == (8 * 2**20, 128 * 2**20)
    assert serve_limits(args).api_trace_level == "basic"
    args = parse_args(["--trace-max-bytes-per-request", "1000", "--trace-store-bytes", "5000",
                       "--api-trace-level", "full"])
    assert (trace_store(args).max_bytes, trace_store(args).max_total_bytes) == (1000, 5000)
    assert serve_limits(args).api_trace_level == "full"
    with pytest.raises(ValueError, match="--trace-store-bytes"):
        trace_store(parse_args(["--trace-max-bytes-per-request", "1000", "--trace-store-bytes", "1500"]))
    with pytest.raises(SystemExit):
        parse_args(["--api-trace-level", "everything"])


@pytest.fixture(scope="module")
def capped(checkpoint):
    """A tiny MoE with its draft and a 100 kB per-request cap (a full trace passes it within a few steps)."""
    with started(app_service(checkpoint, "--block-size", "4", "--trace-max-bytes-per-request", "100000",
                             "--trace-store-bytes", "400000", draft="mistral")) as svc:
        yield svc


def _run(svc, level: str, max_tokens: int = 40):
    from app.serving.requests import build_body
    body = build_body("m", "Be brief.", "Tell me everything about foxes.", 0.8, 0, 1.0, max_tokens, 1, True, 3,
                      level) | {"ignore_eos": True}
    return run_to_end(svc, body)


@pytest.mark.parametrize("live", [0.0, None])
def test_a_truncated_trace_stops_the_captures_says_so_and_still_replays(capped, live):
    """Clock-free: each step's captures built at it (live 0), or all after the answer (None)."""
    from dataclasses import replace

    from app.page.live_view import PANELS, LiveView
    from app.serving.recording import Recording, ReplayCursor, record_request, show_accepted
    from visualizers.journey import journey
    capped.engine.capture = replace(capped.engine.capture, lens_live_seconds=live)
    # 32 tokens: their events (sampling, speculative rounds, KV) fit in twice the cap with room; at 40
    # some draws' runs (more rejected proposals, so more steps) came within a few kB of it
    rid, seen = _run(capped, "full", 32)
    rec = record_request(capped.store, rid, capped.model_info(), capped.piece, capped.is_special)
    cut = rec.truncated
    assert cut is not None and cut["limit_bytes"] == 100_000 and cut["captures_dropped"] >= 1
    heavy = {"attention", "embed", "moe"}
    # what the watcher saw: the engine stopped computing captures after the step that passed the cap
    assert max(i["step"] for i in seen if i["type"] in heavy) <= cut["step"]
    assert any(i["type"] in heavy for i in seen) and max(i["step"] for i in seen) > cut["step"] + 3
    # ... and said so when it happened: a page watching it live shows the note before the end
    note = next(i for i in seen if i["type"] == "trace.truncated")
    assert note["step"] == cut["step"] and note["limit_bytes"] == 100_000
    # ... and where: the pass of that step (the one whose capture passed the cap), the answer token it predicted
    made = len([i for i in seen if i["type"] == "token" and i["step"] < cut["step"]])
    assert note["first_step"] == cut["step"] and note["token_index"] == made
    live = LiveView(model=capped.model_info(), piece=capped.piece, is_special=capped.is_special)
    show_accepted(live, rid, rec.body, "accepted")
    live.add([i for i in seen if i["step"] <= cut["step"]])
    assert f"truncated: at engine step {cut['step']}" in live.render("request") and not live.finished
    kept = [e for e in rec.events if e["type"] in heavy]
    assert kept and max(e["step"] for e in kept) <= cut["step"]
    # everything else went on to the end: every token, the finish
    assert len([e for e in rec.events if e["type"] == "token"]) == 32
    assert any(e["type"] == "finish" for e in rec.events) and rec.outputs[-1]["finished"]
    assert len(json.dumps([rec.events, rec.outputs], separators=SEP)) <= 2 * 100_000
    # the file says so, and replays at every step
    loaded = Recording.loads(rec.dumps())
    assert loaded.truncated == cut
    cursor = ReplayCursor(loaded)
    for frame in range(cursor.last_frame + 1):
        view = cursor.goto(frame)
        assert all(view.render(n) for n in PANELS)
    request_panel = cursor.goto(cursor.last_frame).render("request")
    assert request_panel.count(f"truncated: at engine step {cut['step']}") == 1  # once, not twice
    peak = ReplayCursor(loaded)
    text = {s.key: s.text for s in journey(loaded.model, rid, loaded.body, loaded.events, loaded.outputs,
                                          peak.goto(peak.peak_kv_frame()).pool, loaded.truncated)}
    assert f"size cap at engine step <b>{cut['step']}</b>" in text["embedding"]
    assert "size cap" in text["layers"]


def test_a_trace_under_its_cap_is_whole(capped):
    from app.serving.recording import record_request
    rid, _ = _run(capped, "basic", 12)
    rec = record_request(capped.store, rid, capped.model_info(), capped.piece, capped.is_special)
    assert rec.truncated is None and rec.dropped == 0 and rec.to_json()["truncated"] is None
    assert capped.store.total_bytes <= capped.store.max_total_bytes


def test_compact_captures_are_counted_at_their_real_size():
    """A capture in the compact form (engine/trace/compact.py) is a dict holding one base64
    string: the store counts its JSON exactly while the request runs, not as 400 bytes."""
    import torch
    from engine.trace.compact import encode_probs, encode_rows
    store = TraceStore(max_bytes_per_request=400_000, max_total_bytes=1_000_000)
    g = torch.Generator().manual_seed(1)
    for step in range(20):
        probs = torch.softmax(torch.randn(30, 9, 1, 64, generator=g) * 3, dim=-1)
        store.add("a", {"type": "attention", "request_id": "a", "step": step, "probs": encode_probs(probs)})
        store.add("a", {"type": "embed", "request_id": "a", "step": step,
                        "rows": encode_rows(torch.randn(1, 64, generator=g))})
    tr = store.trace("a")
    assert tr.truncated is None and tr.nbytes > 20 * 5_000
    assert tr.nbytes == sum(len(json.dumps(e, separators=SEP)) for e in tr.events)  # (the list's commas: once packed)
    for step in range(20, 60):  # and the cap applies to that real size
        store.add("a", {"type": "attention", "request_id": "a", "step": step,
                        "probs": encode_probs(torch.softmax(torch.randn(30, 9, 1, 64, generator=g) * 3, dim=-1))})
    assert store.trace("a").truncated is not None and store.trace("a").nbytes <= 400_000
