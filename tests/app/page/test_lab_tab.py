"""The Experiments tab's handlers without a browser: a real run's progress and result as the
tab shows them, the exports, one experiment at a time, cancel from the tab that started it,
off on a public server unless --lab, no path from the browser, plotly.js served by this
server, and the result as a classroom stage of its own."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.__main__ import parse_args, serve_limits
from app.classroom.lab_stage import figures_frame, open_room
from app.classroom.rooms import Classrooms
from app.page import lab_tab
from app.page.lab_tab import EMBEDDED, LabDesk, add_lab_routes, lab_desk, watch

pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")


@pytest.fixture(scope="module")
def shown():
    """Every update the Run handler sent for a real routing run at size ci, and the desk."""
    desk = LabDesk(True, classrooms=Classrooms())
    updates = list(watch(desk, "tab-a", "routing", EMBEDDED, "ci"))
    return updates, desk


@pytest.mark.slow  # a real experiment run, or engines built
def test_run_shows_progress_then_the_result_and_its_exports(shown):
    updates, desk = shown
    progress = [u[0] for u in updates[:-1]]
    assert any("setting 1 of 3" in p and "round-robin" in p for p in progress)
    assert any("setting 3 of 3" in p and "prefix-aware" in p for p in progress)
    fractions = [float(p.split("data-fraction='")[1].split("'")[0]) for p in progress]
    assert fractions == sorted(fractions) and 0 <= fractions[0] < fractions[-1] <= 1  # the bar only moves on
    last, result_box, as_json, as_html = updates[-1]
    result = desk.last["tab-a"]
    assert "done in" in last and result["experiment"] == "routing" and not result["cancelled"]
    for sentence in result["sentences"]:
        assert sentence.replace("'", "&#x27;") in result_box
    assert "<iframe id='tt-lab-figures'" in result_box
    assert json.loads(Path(as_json).read_text()) == json.loads(json.dumps(result))
    page = Path(as_html).read_text()
    assert "Plotly.newPlot" in page and len(page) > 1_000_000  # plotly.js inside: it opens offline


def test_one_experiment_at_a_time_and_only_its_tab_cancels_it(monkeypatch):
    release = threading.Event()

    def blocking(name, model=None, size="ci", progress=None, cancelled=None, **kw):
        while not cancelled() and not release.is_set():
            time.sleep(0.01)
        return SimpleNamespace(to_json=lambda: {"experiment": name, "cancelled": cancelled(), "model": model})
    monkeypatch.setattr(lab_tab, "run", blocking)
    desk = LabDesk(True, models={EMBEDDED: None, "smol": "/models/smol"})
    first = desk.start("tab-a", "routing", "smol", "ci")
    assert isinstance(first, lab_tab.LabRun)
    second = desk.start("tab-b", "batching", EMBEDDED, "ci")
    assert isinstance(second, str) and second.startswith("Another experiment is running (Prefix caching and routing")
    assert "only that tab can cancel it" in desk.cancel("tab-b") and not first.cancel.is_set()
    assert desk.cancel("tab-a").startswith("Cancelling")
    assert first.done.wait(10) and first.result == {"experiment": "routing", "cancelled": True,
                                                    "model": "/models/smol"}  # the name's checkpoint
    third = desk.start("tab-b", "batching", EMBEDDED, "ci")  # free again
    assert isinstance(third, lab_tab.LabRun)
    release.set()
    assert third.done.wait(10) and desk.cancel("tab-b") == "Nothing is running."


def test_bad_choices_are_refused_and_errors_are_said(monkeypatch):
    desk = LabDesk(True)
    assert desk.start("t", "routing", "/etc/passwd", "ci").startswith("No model '/etc/passwd' here")
    assert desk.start("t", "no-such", EMBEDDED, "ci").startswith("No experiment 'no-such'")
    assert desk.start("t", "routing", EMBEDDED, "huge").startswith("Pick a size")

    def failing(*a, **k):
        raise RuntimeError("cannot read /secret/model.gguf")
    monkeypatch.setattr(lab_tab, "run", failing)
    for public, said in ((False, "the experiment failed: cannot read /secret/model.gguf"),
                         (True, "the experiment failed; the server log has the details")):
        shown = list(watch(LabDesk(True, public=public), "t", "routing", EMBEDDED, "ci"))[-1][0]
        assert said in shown
        assert ("/secret" in shown) == (not public)  # public mode: no path in what a visitor sees
    refused = list(watch(LabDesk(False, "Experiments are off"), "t", "routing", EMBEDDED, "ci"))
    assert len(refused) == 1 and "Experiments are off" in refused[0][0]


class Served(list):
    """ServedModels as lab_desk reads it: its limits, and no models but the embedded one."""
    limits = None


def test_public_servers_run_experiments_only_with_lab():
    for argv, on in (([], True), (["--public"], False), (["--public", "--lab"], True),
                     (["--host", "0.0.0.0"], False)):
        models = Served()
        models.limits = serve_limits(parse_args(argv))
        desk = lab_desk(SimpleNamespace(live=True, models=models, model={}, classrooms=None))
        assert desk.enabled == on, argv
        if not on:
            assert "--lab" in desk.off_reason and desk.start("t", "routing", EMBEDDED, "ci") == desk.off_reason
    replay = lab_desk(SimpleNamespace(live=False))
    assert not replay.enabled and "python -m app.lab" in replay.off_reason


def test_plotly_js_is_served_from_the_installed_package():
    import plotly
    api = FastAPI()
    add_lab_routes(api)
    r = TestClient(api).get("/lab/plotly.min.js")
    own = (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()
    assert r.status_code == 200 and r.content == own and r.headers["content-type"].startswith("application/javascript")


@pytest.mark.slow  # a real experiment run, or engines built
def test_the_figures_frame_escapes_what_it_draws(shown):
    _, desk = shown
    result = json.loads(json.dumps(desk.last["tab-a"]))
    result["settings"][0]["setting"]["label"] = "</script><img src=x onerror=alert(1)>"
    frame = figures_frame(result)
    srcdoc = frame.split('srcdoc="')[1].rsplit('"', 1)[0]
    assert "<" not in srcdoc and "<img" not in frame  # the attribute holds escaped HTML only
    import html
    doc = html.unescape(srcdoc)
    assert "</script><img" not in doc and "src='/lab/plotly.min.js'" in doc


@pytest.mark.slow  # a real experiment run, or engines built
def test_a_result_is_a_classroom_stage_of_its_own(shown):
    _, desk = shown
    result = desk.last["tab-a"]
    links = desk.open_in_classroom("tab-a")
    room_id = links.split("/classroom/")[1].split("?")[0]
    room = desk.classrooms.get(room_id)
    stages = room.stage_list()
    assert [s.key for s in stages] == ["experiment"] and stages[0].title == f"Experiment: {result['title']}"
    body = room.render(0)
    assert "tt-lab-figures" in body and "prefill tokens" in body
    assert "Run an experiment first" in desk.open_in_classroom("tab-never-ran")
    # the room opens without a served model's facts too
    alone = open_room(Classrooms(), result)
    assert alone.stage_list()[0].key == "experiment"


@pytest.mark.slow  # a real experiment run, or engines built
def test_a_public_page_says_experiments_are_off_and_its_buttons_do_nothing():
    from app.__main__ import build_services
    from app.page.layout import build_page
    for argv, off in ((["--public"], True), (["--public", "--lab"], False)):
        models = build_services(parse_args(["--draft", "none", "--num-kv-blocks", "16", *argv]), say=lambda _: None)
        page = build_page(models)
        comps = {c.get("props", {}).get("elem_id"): c["props"] for c in page.config["components"]}
        said = comps.get("tt-lab-off-box", {}).get("value", "")  # below the intro, when off
        assert ("id='tt-lab-off'" in said and "--lab" in said) == off, argv
        assert comps["tt-lab-run"]["interactive"] is (not off) and comps["tt-lab-exp"]["interactive"] is (not off)
        assert [c[0] for c in comps["tt-lab-model"]["choices"]] == [EMBEDDED]  # names only: no path
