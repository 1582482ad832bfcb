"""`--replicas N`: one model on N engines (each its own KV pool and thread) behind a router:
the policies' decisions, the engine's public prefix-cache question, and a server with two
replicas answering the API, with each request's replica in its trace."""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

import httpx
import pytest

from app.__main__ import build_services, parse_args
from app.serving.router import Router
from tests.paths import ROOT
from tests.service_utils import pace, served

TARGET = str(ROOT / "assets" / "models" / "target")
pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")
SYSTEM = ("You are a patient teacher of how language models serve requests: tokens, pages, batches, the "
          "prefix cache and sampling, always with one short example.")


@dataclass
class Fake:
    """A replica as the router sees it: its load and what its cache holds of any prompt."""
    load: int = 0
    cached: int = 0

    def in_flight(self) -> int:
        return self.load

    def cached_prefix_tokens(self, token_ids: list[int]) -> int:
        return min(self.cached, len(token_ids))


def test_round_robin_takes_turns_whatever_the_load():
    r, reps = Router("round-robin"), [Fake(9), Fake(0), Fake(0)]
    assert [r.choose([1, 2, 3], reps).replica for _ in range(5)] == [0, 1, 2, 0, 1]


def test_least_loaded_picks_the_emptiest_and_rotates_among_ties():
    r = Router("least-loaded")
    route = r.choose([1], [Fake(3), Fake(1), Fake(2)])
    assert (route.replica, route.loads, route.of) == (1, [3, 1, 2], 3)
    idle = [Fake(), Fake(), Fake()]
    assert [r.choose([1], idle).replica for _ in range(4)] == [2, 0, 1, 2]  # after replica 1: 2, then around


def test_prefix_aware_follows_the_cache_else_the_load():
    r = Router("prefix-aware")
    route = r.choose(list(range(40)), [Fake(0, 0), Fake(5, 32), Fake(1, 16)])
    assert route.replica == 1 and route.cached == [0, 32, 16] and route.prompt_tokens == 40
    assert "32 tokens" in route.reason
    # equal prefixes: the less loaded of them
    assert r.choose(list(range(40)), [Fake(4, 32), Fake(2, 32), Fake(0, 0)]).replica == 1
    # nothing cached anywhere: the least loaded
    route = r.choose(list(range(40)), [Fake(3), Fake(2), Fake(5)])
    assert route.replica == 1 and "no replica holds" in route.reason
    # a hot replica is not piled on (SGLang's balance guard)
    route = Router("prefix-aware", balance_abs=4).choose([1] * 40, [Fake(9, 32), Fake(0, 0)])
    assert route.replica == 1 and "too far apart" in route.reason
    assert r.choose(None, [Fake(1), Fake(0)]).replica == 1  # no ids (tokenizing failed): by load


def test_an_unknown_policy_and_bad_replica_counts_are_refused():
    with pytest.raises(ValueError, match="round-robin, least-loaded, prefix-aware"):
        Router("random")
    for argv in (["--replicas", "5"], ["--replicas", "0"], ["--router", "round-robin"],
                 ["--replicas", "2", "--router", "fastest"], ["--replicas", "2", "--tensor-parallel-size", "2"]):
        with pytest.raises(SystemExit):
            parse_args(argv)
    args = parse_args(["--replicas", "3", "--router", "least-loaded"])
    assert (args.replicas, args.router) == (3, "least-loaded")


@pytest.mark.slow  # real engines
def test_the_engine_says_how_much_of_a_prompt_its_cache_holds():
    from engine import EngineConfig, LLMEngine, SamplingParams
    engine = LLMEngine(TARGET, config=EngineConfig(num_kv_blocks=64, block_size=4))
    ids = engine.tokenizer.encode(SYSTEM + " What is a page?")
    assert engine.cached_prefix_tokens(ids) == 0
    engine.add_request(ids, SamplingParams(temperature=0, max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.cached_prefix_tokens(ids) == (len(ids) - 1) // 4 * 4  # one token is always computed
    other = ids[:9] + [t + 1 for t in ids[9:]]  # the same first 9 tokens, then different ones
    assert engine.cached_prefix_tokens(other) == 8
    assert engine.cached_prefix_tokens([ids[0] + 1] + ids[1:]) == 0
    before = engine.load()
    engine.cached_prefix_tokens(ids)
    assert engine.load() == before  # a question: nothing taken, nothing counted


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    lines: list[str] = []
    models = build_services(parse_args(["--model", TARGET, "--draft", "none", "--replicas", "2", "--num-kv-blocks",
                                        "64", "--block-size", "4"]), say=lines.append)
    models.lines = lines
    with served(models, tmp_path_factory) as srv:
        yield srv


def settled(group, timeout: float = 10.0) -> bool:
    """Every request the set sent has ended and its finish reached the set's listeners (they run
    on the engine threads just after the step that ended it: wait_idle alone can be a moment early)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if group._live == [set()] * len(group.replicas) and group._prompts == [{}] * len(group.replicas):
            return True
        time.sleep(0.01)
    return False


def chat(server, system: str, user: str, **kw) -> dict:
    body = {"model": "target", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": 4, "temperature": 0, **kw}
    r = httpx.post(server.url + "v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def route_of(server, request_id: str) -> dict:
    trace = httpx.get(server.url + f"v1/traces/{request_id}", timeout=30).json()
    return next(e for e in trace["events"] if e["type"] == "request.arrive")["replica"]


@pytest.mark.slow  # real engines
def test_two_replicas_are_one_model_on_two_engines(server):
    models = server.models
    assert models.names == ["target"] and len(models) == 1
    group = models.first
    engines = [r.engine for r in group.replicas]
    assert len({id(e) for e in engines}) == 2 and len({id(e.runner.kv_cache) for e in engines}) == 2
    assert len({id(r._thread) for r in group.replicas}) == 2 and all(r._thread.is_alive() for r in group.replicas)
    assert [line for line in models.lines if line.startswith("[")] == [
        f"[1/1] loading {TARGET}, replica 1 of 2", f"[1/1] loading {TARGET}, replica 2 of 2"]
    info = group.model_info()
    assert (info["replicas"], info["router"], info["name"]) == (2, "prefix-aware", "target")
    models_list = httpx.get(server.url + "v1/models", timeout=30).json()
    assert [m["id"] for m in models_list["data"]] == ["target"]


@pytest.mark.slow  # real engines
def test_the_api_answers_as_one_engine_and_shared_prompts_meet_their_cache(server):
    from engine import LLM, SamplingParams
    group = server.models.first
    group.router = Router("prefix-aware")
    first = chat(server, SYSTEM, "What is a page?")
    own = LLM(TARGET, num_kv_blocks=64).chat([{"role": "system", "content": SYSTEM},
                                             {"role": "user", "content": "What is a page?"}],
                                            SamplingParams(temperature=0, max_tokens=4))
    assert first["choices"][0]["message"]["content"] == own.text
    a = route_of(server, first["id"])
    assert a["policy"] == "prefix-aware" and a["of"] == 2 and a["prompt_tokens"] == first["usage"]["prompt_tokens"]
    # the same system prompt again: the replica that has it cached, and the prefill it skips
    again = chat(server, SYSTEM, "And a block?")
    b = route_of(server, again["id"])
    assert b["replica"] == a["replica"] and b["cached"][a["replica"]] > 0 and b["cached"][1 - a["replica"]] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == b["cached"][a["replica"]]
    assert server.models.owner(again["id"]) is group
    # round-robin: turns, whatever the cache holds
    group.router = Router("round-robin")
    turns = [route_of(server, chat(server, SYSTEM, f"Question {i}?")["id"])["replica"] for i in range(4)]
    assert turns in ([0, 1, 0, 1], [1, 0, 1, 0])


@pytest.mark.slow  # real engines
def test_streaming_watching_and_metrics_reach_the_right_replica(server):
    from websockets.sync.client import connect
    group = server.models.first
    group.router = Router("round-robin")
    body = {"model": "target", "messages": [{"role": "user", "content": "Tell me a fortune."}], "max_tokens": 5,
            "temperature": 0, "stream": True}
    for _ in range(2):  # one on each replica
        with httpx.stream("POST", server.url + "v1/chat/completions", json=body, timeout=60) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    ws_url = server.url.replace("http://", "ws://") + "ws"
    with connect(ws_url, max_queue=None) as ws:  # sent over /ws and watched by id: its events, to the finish
        ws.send(json.dumps({"model": "target", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}))
        types = []
        while "finish" not in types:
            ev = json.loads(ws.recv(timeout=30))
            types.append(ev["type"])
        assert "request.arrive" in types
    metrics = httpx.get(server.url + "metrics", timeout=30).text
    for i in (0, 1):
        assert f'tokentrace_requests_running{{model="target",replica="{i}"}} ' in metrics
    assert metrics.count("# TYPE tokentrace_requests_running gauge") == 1
    served_steps = [r.engine.load().target_passes for r in group.replicas]
    assert all(s > 0 for s in served_steps)  # both engines did work


@pytest.mark.slow  # real engines
def test_the_router_counts_what_is_in_flight_without_waiting_for_an_engine(server):
    from app.serving.engine_service import wait_idle
    from app.serving.requests import parse_body
    group = server.models.first
    group.router = Router("least-loaded")
    assert wait_idle(server.models) and settled(group)  # everything sent so far has ended
    body = {"model": "target", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "n": 2}
    steps = [r.engine.step for r in group.replicas]
    for r in group.replicas:
        pace(r.engine, 0.3)  # slow enough to be seen in flight
    held, release, let_go = threading.Event(), threading.Event(), threading.Event()
    try:
        watch = group.submit(parse_body(body))
        c = next(i for i, live in enumerate(group._live) if live)
        assert group._live[c] == {watch.request_id, watch.request_id + ".1"} and group._live[1 - c] == set()

        def long_step():  # the other replica's engine busy (its lock held), as in a long prefill
            with group.replicas[1 - c].engine.lock:
                held.set()
                release.wait(60)
            let_go.set()
        threading.Thread(target=long_step, daemon=True).start()
        assert held.wait(5)
        route = group.route(parse_body(body))  # its two choices count as two
        # no wait for the busy engine: routed while its lock is still held (however slow the machine)
        assert not let_go.is_set()
        assert route.loads[c] == 2 and route.loads[1 - c] == 0 and route.replica == 1 - c
    finally:
        release.set()
        for r, step in zip(group.replicas, steps):
            r.engine.step = step
    assert wait_idle(server.models) and settled(group)
    group.unsubscribe(watch)
    with pytest.raises(ValueError):  # refused by the engine: nothing left counted or routed
        group.submit(parse_body({"model": "target", "messages": [{"role": "user", "content": "x" * 9000}],
                                 "max_tokens": 2}))
    assert group._live == [set(), set()]


@pytest.mark.slow  # real engines
def test_the_request_stage_names_the_replica_and_why(server):
    from visualizers.stages import Facts, request
    server.models.first.router = Router("prefix-aware")
    reply = chat(server, SYSTEM, "Who <b>routes</b>?")
    trace = httpx.get(server.url + f"v1/traces/{reply['id']}", timeout=30).json()
    route = route_of(server, reply["id"])
    f = Facts.read(trace["model"], reply["id"], trace["body"], trace["events"], trace.get("outputs", []))
    text = request(f).text
    assert f"replica <b>{route['replica'] + 1}</b>" in text and "<b>2</b> replicas" in text
    assert "prefix-aware router" in text
    assert route["reason"].split(" (")[0] in text
    # one engine: no word of replicas
    plain = [e for e in trace["events"] if e["type"] != "request.arrive"] + \
        [{k: v for k, v in next(e for e in trace["events"] if e["type"] == "request.arrive").items() if k != "replica"}]
    assert "replica" not in request(Facts.read(trace["model"], reply["id"], trace["body"], plain, [])).text


@pytest.mark.slow  # real engines
def test_the_page_sends_to_a_replica_and_its_request_stage_says_which(server):
    from app.page.controller import Controller, Controls
    server.models.first.router = Router("least-loaded")
    ctl = Controller(server.models)
    c = Controls(system=SYSTEM, user="Where did I go?", max_tokens=4, seed="3", level="basic", model="target")
    updates = list(ctl.run("replica-tab", c))
    assert "finished" in [u["status"] for u in updates if "status" in u][-1]
    text = next(u["stage:request"] for u in reversed(updates) if "stage:request" in u)
    assert "least-loaded router sent this request to replica <b>" in text


@pytest.mark.slow  # real engines
def test_a_burst_sharing_a_new_system_prompt_stays_on_one_replica(server):
    """Before the first request's prefill has run nothing is cached anywhere: prefix-aware
    routing counts the prompts it sent and that have not ended (as SGLang's router does), so
    the burst is not spread over the replicas (one step's batch still prefills each of its
    requests: the cache is filled after the pass)."""
    from app.serving.engine_service import wait_idle
    from app.serving.requests import parse_body
    group = server.models.first
    group.router = Router("prefix-aware")
    fresh = "Ahoy: a lighthouse keeper answers here, in the voice of the sea, with one short line each time."
    bodies = [parse_body({"model": "target", "messages": [{"role": "system", "content": fresh},
                                                         {"role": "user", "content": f"Question {i}?"}],
                          "max_tokens": 2}) for i in range(3)]
    assert wait_idle(server.models)
    steps = [r.engine.step for r in group.replicas]
    for r in group.replicas:
        pace(r.engine, 0.5)  # the first prefill has not run when the others arrive
    try:
        assert all(group.route(b).cached == [0, 0] for b in bodies[:1])  # nothing of it anywhere yet
        watches = [group.submit(b) for b in bodies]
        first = group.replica_of(watches[0].request_id)
        assert all(group.replica_of(w.request_id) is first for w in watches)
        assert wait_idle(server.models)
    finally:
        for r, step in zip(group.replicas, steps):
            r.engine.step = step
    for w in watches:
        group.unsubscribe(w)
    # the prompt is in one replica's cache only: the other computed none of it
    ids = group.prompt_ids(bodies[0])
    held = [r.engine.cached_prefix_tokens(ids) for r in group.replicas]
    assert held[group.replicas.index(first)] > 0 and held[1 - group.replicas.index(first)] == 0
    assert settled(group)


@pytest.mark.slow  # real engines
def test_a_local_page_watches_a_request_on_a_replica(server, monkeypatch):
    """Watch on a server of replicas: the page follows an API client's request to its end, and the
    replica that runs it leaves a core to the page here while it does (SpareCore), none after."""
    from app.page.controller import Controller, Controls
    from tests.app.serving.test_spare_core import watch_until_done
    from tests.holds import StepGate
    group = server.models.first
    gates = [StepGate((2,)).install(r.engine, monkeypatch) for r in group.replicas]
    ctl = Controller(server.models)
    gen = ctl.follow("replica-watch", Controls(model="target"), "127.0.0.1")
    assert "watching" in next(gen)["status"]
    watcher = threading.Thread(target=watch_until_done, args=(gen,))
    watcher.start()
    sent: list[dict] = []
    client = threading.Thread(target=lambda: sent.append(chat(server, SYSTEM, "Tell me a long story.", max_tokens=12)))
    client.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(r.spare.local for r in group.replicas):
            time.sleep(0.01)
        held = [dict(r.spare.local) for r in group.replicas]
    finally:
        for g in gates:
            g.release_all()
    client.join(60)
    watcher.join(60)
    rid = sent[0]["id"]
    assert sorted(held, key=len) == [{}, {rid: 1}]  # on its own replica, not the other
    assert all(not r.spare.local for r in group.replicas)  # the watch ended with the request
    assert ctl.sessions.get("replica-watch").view.request_id == rid
