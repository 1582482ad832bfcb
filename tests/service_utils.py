"""The app's engine service for tests, built as `python -m app` builds it (one factory for
every module that serves a tiny model), and helpers that drive it the way a page does:
submit a body and read its subscription until the request finishes."""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import httpx
import pytest

from app.__main__ import build_service, parse_args
from app.serving.engine_service import EngineService, wait_idle
from app.serving.recording import Recording, ReplayCursor, record_request
from app.serving.requests import build_body, parse_body
from app.serving.served_models import ServedModels
from benchmarks.local_server import LocalServer
from visualizers.journey import journey

WALK_SYSTEM = ("You are a patient teacher. You explain every step of how a language model answers, from the tokens "
               "to the sampling, and you always give a short example.")


def app_service(checkpoint, *options: str, model: str | None = "mixtral", draft: str | None = None,
                pace_s: float = 0.0) -> EngineService:
    """The app's service (not started) for `python -m app --model M --draft D *options`:
    model / draft name tiny checkpoints (tests/tiny.py; model=None: the embedded model, with
    its embedded draft unless options say otherwise); options: the app's own flags (pool size,
    limits, served name...). pace_s: a sleep before each engine step, for tests that must see
    a request while it runs (the tiny model answers in milliseconds)."""
    args = ["--model", str(checkpoint(model))] if model else []
    args += ["--draft", str(checkpoint(draft))] if draft else []
    svc = build_service(parse_args([*args, *options]))
    if pace_s:
        pace(svc.engine, pace_s)
    return svc


def pace(engine, delay_s: float) -> None:
    """Each engine step waits delay_s first (outside the engine's lock: aborts still land)."""
    step = engine.step

    def paced_step():
        time.sleep(delay_s)
        return step()
    engine.step = paced_step


@contextlib.contextmanager
def started(svc: EngineService) -> Iterator[EngineService]:
    """The service's engine thread running for the block; stopped after it."""
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


@contextlib.contextmanager
def served(service: EngineService | ServedModels, tmp_path_factory, host: str = "127.0.0.1") -> Iterator[LocalServer]:
    """The app (API and page) over `service` on a free port of this machine, in a thread of
    this process (the test reads the engine directly); gradio's files in a temporary folder."""
    os.environ.setdefault("GRADIO_TEMP_DIR", str(tmp_path_factory.mktemp("gradio")))
    with LocalServer(service, host=host) as srv:
        yield srv


def answered_and_held(svc: EngineService, hold, max_tokens: int) -> tuple[str, list[dict], object]:
    """A `full` request (greedy, ignore_eos) submitted to a started service whose engine an
    AfterFinish `hold` waits on: its items until its answer is out and the engine is held
    before the work after it. -> (request id, the items so far, its subscription)."""
    body = build_body("m", "Be brief.", "Count to ten.", 0.0, 0, 1.0, max_tokens, 1, False, 1, "full") | \
        {"ignore_eos": True}
    watch = svc.submit(parse_body(body))
    items: list[dict] = []
    while not any(i["type"] == "output" and i["finished"] for i in items):
        items += watch.drain(0.05)
    assert hold.reached.wait(60)  # the engine's next call: held before the work after the answer
    return watch.request_id, items + watch.drain(0.05), watch


def run_to_end(svc, body: dict, timeout_s: float = 60) -> tuple[str, list[dict]]:
    """Submit `body`; -> (request id, every item its subscription delivered, to the finish
    and a little after)."""
    watch = svc.submit(parse_body(body))
    items, end = [], time.monotonic() + timeout_s
    while not any(i["type"] == "output" and i["finished"] for i in items):
        assert time.monotonic() < end, "the request did not finish"
        items += watch.drain(0.05)
    # its trace's end: the logit lenses of its tokens are computed after its last output, then `finish`
    assert wait_idle(svc, max(1.0, end - time.monotonic())), "the trace did not end"
    time.sleep(0.1)  # anything the finishing step still sends (kv.pool comes before its outputs)
    items += watch.drain(0.05)
    svc.unsubscribe(watch)
    return watch.request_id, items


def traced_run(service, user: str, max_tokens: int = 12, **kw) -> str:
    """A full-trace speculative request (seed 3, ignore_eos) run to its end -> its id."""
    args = dict(model="m", system="Be brief.", user=user, temperature=0.8, top_k=0, top_p=1.0,
                max_tokens=max_tokens, seed=3, speculative=True, k=3, trace_level="full")
    args.update(kw)
    return run_to_end(service, build_body(**args) | {"ignore_eos": True})[0]


def record_run(svc, user: str, system: str = WALK_SYSTEM, max_tokens: int = 24, speculative: bool = True) -> Recording:
    """A full-trace request (k=4, ignore_eos) run to its end -> its recording."""
    body = build_body("m", system, user, 0.8, 0, 1.0, max_tokens, 5, speculative, 4, "full") | {"ignore_eos": True}
    rid, _ = run_to_end(svc, body, timeout_s=120)
    return record_request(svc.store, rid, svc.model_info(), svc.piece, svc.is_special)


def walk(rec: Recording) -> dict[str, str]:
    """The walkthrough's text per stage key, with the KV pool at its peak."""
    cursor = ReplayCursor(rec)
    peak = cursor.goto(cursor.peak_kv_frame()).pool
    return {s.key: s.text for s in journey(rec.model, rec.request_id, rec.body, rec.events, rec.outputs, peak,
                                           rec.truncated)}


def stage_index(server, room: dict, key: str) -> int:
    """Where a stage stands in a classroom (stages may be added before it)."""
    return next(i for i in range(room["stages"])
                if httpx.get(server.url + f"classroom/{room['id']}/stage/{i}").json()["key"] == key)


def api_fixtures(name: str) -> tuple:
    """Module-scoped `server` and `client` fixtures for a module that drives the API: the tiny
    MoE served as `name` (block size 4) over HTTP, and the official `openai` SDK's client for it
    (`server, client = api_fixtures("tiny-moe")`)."""
    @pytest.fixture(scope="module")
    def server(checkpoint, tmp_path_factory):
        with served(app_service(checkpoint, "--served-model-name", name, "--block-size", "4"),
                    tmp_path_factory) as srv:
            yield srv

    @pytest.fixture(scope="module")
    def client(server):
        from openai import OpenAI
        return OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0)
    return server, client
