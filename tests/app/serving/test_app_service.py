"""app/: the engine service (background engine thread, per-request queues, trace store,
the KV pool from the engine's kv.pool events), request parsing and the live view, without a web server."""
from __future__ import annotations

import threading
import time

import pytest

from app.__main__ import parse_args
from app.serving.engine_service import wait_idle
from app.page.live_view import PANELS, LiveView
from app.serving.requests import build_body, parse_body
from tests.service_utils import app_service, started


@pytest.fixture(scope="module")
def service(checkpoint):
    with started(app_service(checkpoint, "--num-speculative-tokens", "4", "--num-kv-blocks", "64",
                             draft="mistral")) as svc:
        yield svc


def body(user="Tell me a story.", max_tokens=8, **kw):
    args = dict(model="m", system="Be brief.", user=user, temperature=0.8, top_k=0, top_p=1.0,
                max_tokens=max_tokens, seed=1, speculative=True, k=4, trace_level="full")
    args.update(kw)
    return build_body(**args)


def collect(watch, timeout=60.0) -> list[dict]:
    items, end = [], time.monotonic() + timeout
    while time.monotonic() < end:
        items += watch.drain(0.05)
        # the client's finished output, then (traced) the trace's finish event: it follows the lenses
        if any(i["type"] == "output" and i["finished"] for i in items) and (
                not any(i["type"] == "request.arrive" for i in items) or any(i["type"] == "finish" for i in items)):
            return items
    raise AssertionError("the request did not finish")


def test_cli_options_reach_the_engine(service):
    e = service.engine
    assert e.block_manager.num_blocks == 64 and e.speculator is not None and e.num_speculative_tokens == 4
    info = service.model_info()
    assert info["num_blocks"] == 64 and info["is_moe"] and info["num_kv_heads"] == 2
    assert info["kv_cache_bytes"] == e.runner.kv_cache_bytes
    args = parse_args(["--host", "0.0.0.0", "--port", "9", "--device", "cpu", "--dtype", "bfloat16",
                       "--block-size", "8", "--kv-cache-memory-fraction", "0.5", "--no-prefix-caching"])
    assert (args.host, args.port, args.device, args.dtype, args.block_size) == ("0.0.0.0", 9, "cpu", "bfloat16", 8)
    assert args.kv_cache_memory_fraction == 0.5 and args.no_prefix_caching


def test_parse_body_checks_and_rejects():
    sub = parse_body(body(top_k=5, k=2))
    assert sub.params.top_k == 5 and sub.num_speculative_tokens == 2 and sub.trace_level == "full"
    assert [c[0] for c in sub.checks] == ["messages", "sampling"] and all(c[1] for c in sub.checks)
    for bad, msg in ((body(user="  "), "empty"), (body(top_p=0.0), "top_p"), (body(temperature=-1), "temperature"),
                     (body(trace_level="everything"), "trace_level"), ({"messages": []}, "non-empty")):
        with pytest.raises(ValueError, match=msg) as err:
            parse_body(bad)
        assert err.value.checks[-1][1] is False


def test_a_request_streams_every_stage_to_its_own_queue(service):
    watch = service.submit(parse_body(body(max_tokens=8, k=2)))
    items = collect(watch)
    rid = watch.request_id
    types = {i["type"] for i in items}
    for t in ("request.arrive", "tokenize", "prefix_cache.lookup", "kv.alloc", "schedule.step", "kv.fill", "embed",
              "attention", "moe", "sample", "spec", "token", "finish", "kv.free", "output"):
        assert t in types, t
    assert all(i["request_id"] == rid for i in items if i["type"] not in ("schedule.step", "kv.pool"))
    assert all(rid in [b["request_id"] for b in i["batch"]] for i in items if i["type"] == "schedule.step")
    pools = [i for i in items if i["type"] == "kv.pool" and rid in i["request_ids"]]  # the pool, every block
    assert pools and pools[0]["full"] and not any(p["full"] for p in pools[1:])
    assert max(i["k"] for i in items if i["type"] == "spec") <= 2  # the per-request k holds
    outputs = [i for i in items if i["type"] == "output"]
    assert len(outputs) == 8 and outputs[-1]["finish_reason"] == "length"
    # the trace store keeps the request's events; the engine has forgotten it
    stored = service.store.get(rid)
    assert [e["type"] for e in stored][:2] == ["request.arrive", "tokenize"]
    assert rid not in service.engine.requests
    service.unsubscribe(watch)


def test_kv_pool_shows_every_live_requests_blocks(service):
    seen_two = threading.Event()
    # ignore_eos: a random checkpoint may sample EOS at once, and then the two never overlap
    a = service.submit(parse_body(body(user="first request " * 6, max_tokens=40, trace_level="basic") | {"ignore_eos": True}))
    b = service.submit(parse_body(body(user="second request " * 6, max_tokens=40, trace_level="off") | {"ignore_eos": True}))
    end = time.monotonic() + 60
    while time.monotonic() < end and not seen_two.is_set():
        snap = service.pool()
        owners = {r for rids in snap["owners"].values() for r in rids}
        if {a.request_id, b.request_id} <= owners:
            seen_two.set()
            mine = [blk for blk, rids in snap["owners"].items() if a.request_id in rids]
            assert all(1 <= snap["fill"][blk] <= snap["block_size"] for blk in mine)
            assert all(snap["ref"][blk] >= 1 for blk in mine)
        time.sleep(0.005)
    collect(a), collect(b)
    service.unsubscribe(a), service.unsubscribe(b)
    assert seen_two.is_set(), "never saw both requests' blocks in one pool"
    # an untraced request records only the batches it was part of (its blocks are in a's kv.pool events)
    assert {e["type"] for e in service.store.get(b.request_id)} == {"schedule.step"}
    assert any(b.request_id in rids for e in service.store.get(a.request_id) if e["type"] == "kv.pool"
               for rids in e["owners"])
    assert wait_idle(service)
    time.sleep(0.1)  # the last step's kv.pool, from the engine thread
    snap = service.pool()
    assert snap["owners"] == {} and sum(snap["ref"]) == 0


def test_abort_and_engine_refusals(service):
    watch = service.submit(parse_body(body(max_tokens=200, trace_level="basic")))
    while not service.store.get(watch.request_id) or not any(
            e["type"] == "token" for e in service.store.get(watch.request_id)):
        time.sleep(0.01)
    assert service.abort(watch.request_id)
    items = collect(watch)
    # (a token from the step that was running may still arrive after the abort notice)
    assert [i["finish_reason"] for i in items if i["type"] == "output" and i["finished"]] == ["abort"]
    assert any(e["type"] == "finish" and e["reason"] == "abort" for e in service.store.get(watch.request_id))
    service.unsubscribe(watch)
    before, kept = dict(service._subs), service.store.request_ids()
    with pytest.raises(ValueError, match="context|KV cache"):
        service.submit(parse_body(body(user="long " * 2000)))
    with pytest.raises(ValueError, match="max_tokens is too large") as err:  # the engine's one context check
        service.submit(parse_body(body(max_tokens=10**6)))
    assert err.value.param == "max_tokens" and err.value.code == "context_length_exceeded"
    assert service._subs == before and service.store.request_ids() == kept  # a refused request leaves nothing


def test_live_view_renders_every_panel_and_redraws_only_what_changed(service):
    m = service.model_info()
    view = LiveView(model=m, piece=service.piece, is_special=service.is_special)
    view.body = body(user="<img src=x onerror=alert(1)>", max_tokens=6)
    watch = service.submit(parse_body(view.body))
    view.request_id, view.validation = watch.request_id, {"ok": True, "request_id": watch.request_id}
    view.draw(list(PANELS), 0.0)
    assert not view.dirty
    view.add(collect(watch))  # the kv.pool events among them draw the pool
    assert view.finished and set(view.dirty) == set(PANELS)
    html = view.draw(view.due(time.perf_counter(), force=True), time.perf_counter())
    assert set(html) == set(PANELS)
    assert "<img src=x" not in "".join(html.values())
    assert "tt-empty" not in html["attention"] and "tt-empty" not in html["moe"] and "tt-empty" not in html["spec"]
    assert len(view.generated_ids()) == 6 and len(view.labels()) == view.first("tokenize")["count"] + 6
    view.add([{"type": "output", "request_id": view.request_id, "token_id": 3, "text": "x", "index": 6, "t": 1.0,
               "finished": False, "finish_reason": None}])
    assert view.dirty == {"answer", "tokens"}
    assert view.due(time.perf_counter()) == ["answer"]  # tokens were redrawn moments ago: throttled
    service.unsubscribe(watch)


def test_live_view_shows_a_panels_first_content_at_once(service):
    """Placeholders (the queued frame) do not use up a heavy panel's redraw allowance, so
    a request that streams faster than the allowance still shows each stage mid-stream."""
    view = LiveView(model=service.model_info(), piece=service.piece, is_special=service.is_special)
    view.draw(list(PANELS), 100.0)  # the blank frame
    embed = {"type": "embed", "request_id": "r", "step": 1, "ts": 0.0, "start": 0, "token_ids": [5],
             "rows": [[0.1]], "shape": [1, 8]}
    view.add([embed])
    assert "embedding" in view.due(100.01)  # the first rows: drawn at once
    view.draw(["embedding"], 100.01)
    view.add([dict(embed, step=2, start=1)])
    assert "embedding" not in view.due(100.02)  # later rows: throttled
    assert "embedding" in view.due(100.01 + 1.5)
