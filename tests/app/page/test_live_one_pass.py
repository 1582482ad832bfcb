"""Issue 25, items 2 and 6 (the last session's closing note): every panel that shows the
selected pass shows the SAME pass in every update while a request streams, and says which;
the stages' sentences that quote a pass quote that one too. The panels redrew each on its own
clock (KV, Sampling and Speculation every 0.5 s, Embedding, Attention and the lens every
0.45 s), so one picture mid-stream held two passes, and the Speculation panel named none.

Read from the controller's own updates, folded as the browser folds them (each output keeps
its last value), with no browser: tests/app/page/test_live_browser.py checks the picture."""
from __future__ import annotations

import re

import pytest

from app.page.controller import Controller, Controls
from app.page.live_view import ONE_PASS_EVERY, LiveView
from tests.service_utils import app_service, started

pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")

PANEL_PASS = re.compile(r'class="tt-sel-pass">selected: the pass that read .*? \(position (\d+)\) and predicted')
WORDS_PASS = re.compile(r"the pass that read .*? \(position ([\d,]+)\) and predicted")
QUOTING = ("logit_lens", "sampling")  # the stages whose sentence names a pass
ONE_PASS = ("embedding", "attention", "kv", "moe", "logit_lens", "sampling", "spec")  # the panels that name one


@pytest.fixture(scope="module")
def service(checkpoint):
    """The tiny MoE and its draft, each step paced so that a 40-token answer streams for seconds."""
    with started(app_service(checkpoint, "--num-speculative-tokens", "3", "--num-kv-blocks", "96", draft="mistral",
                             pace_s=0.12)) as svc:
        yield svc


def value(v):
    return v.get("value") if isinstance(v, dict) else v


def passes_on_screen(screen: dict) -> dict[str, int]:
    """The pass each panel and stage sentence on screen names (its read position)."""
    out = {}
    for name in ONE_PASS:
        m = PANEL_PASS.search(screen.get(name) or "")
        if m:
            out[name] = int(m[1])
    for key in QUOTING:
        m = WORDS_PASS.search(screen.get(f"stage:{key}") or "")
        if m:
            out[f"stage:{key}"] = int(m[1].replace(",", ""))
    return out


def test_every_update_mid_stream_shows_one_pass_and_names_it(service):
    ctl = Controller(service)
    c = Controls(user="Tell me a long story about a fox and an owl.", max_tokens=48, seed="4", level="full",
                 model=ctl.model["name"], speculative=True, k=3)
    screen: dict = {}
    pictures = []
    for update in ctl.run("one-pass", c):
        for name, v in update.items():
            if isinstance(value(v), str):
                screen[name] = value(v)
        if "streaming" in str(update.get("status", screen.get("status", ""))):
            pictures.append(passes_on_screen(screen))
    assert "finished" in screen["status"], screen["status"]
    mixed = [p for p in pictures if len(set(p.values())) > 1]
    assert not mixed, mixed[:3]  # one picture, two passes
    shown = {v for p in pictures for v in p.values()}
    assert len(shown) >= 3, pictures  # the default (the newest pass) moved as tokens streamed
    # once every panel has content, each names its pass: the Speculation panel too (it named none)
    last = passes_on_screen(screen)
    assert set(last) >= set(ONE_PASS) | {f"stage:{k}" for k in QUOTING}, (sorted(last), screen.get("spec", "")[:300])
    assert len(set(last.values())) == 1, last


def test_a_click_moves_every_panel_and_sentence_to_the_clicked_pass(service):
    ctl = Controller(service)
    c = Controls(user="Name three colours.", max_tokens=12, seed="2", level="full", model=ctl.model["name"])
    screen: dict = {}
    for update in ctl.run("one-click", c):
        screen.update({n: value(v) for n, v in update.items() if isinstance(value(v), str)})
    view: LiveView = ctl.sessions.get("one-click").view
    n_prompt = view.first("tokenize")["count"]
    clicked = n_prompt + 3  # the 4th answer token: the pass that read it predicted the 5th
    picked = ctl.pick_token("one-click", f"{clicked}:1", c)
    screen.update({n: value(v) for n, v in picked.items() if isinstance(value(v), str)})
    got = passes_on_screen(screen)
    assert set(got) >= {"embedding", "attention", "kv", "sampling", "logit_lens", "spec"} | \
        {f"stage:{k}" for k in QUOTING}, sorted(got)
    assert set(got.values()) == {clicked}, got


def test_the_selected_panels_are_due_together_or_not_at_all(service):
    """A panel's own clock no longer decides: the group is redrawn as one, and a panel whose
    input did not change is redrawn too when the newest pass moved past the one it shows."""
    view = LiveView(model=service.model_info(), piece=service.piece, is_special=service.is_special)
    view.request_id = "r"
    tok = {"type": "tokenize", "request_id": "r", "step": 0, "ts": 0.0, "count": 3, "vocab_size": 50,
           "tokens": [{"id": 5, "text": "a", "piece": "a"}] * 3}
    embed = {"type": "embed", "request_id": "r", "step": 1, "ts": 0.0, "start": 0, "token_ids": [5, 5, 5],
             "rows": [[0.1]] * 3, "shape": [3, 8]}
    out = {"type": "output", "request_id": "r", "token_id": 7, "text": "b", "index": 0, "t": 0.1, "step": 1,
           "finished": False, "finish_reason": None}
    view.add([tok, embed, out, dict(out, index=1, step=2)])
    assert {"embedding"} <= set(view.due(10.0))
    view.draw(view.due(10.0), 10.0)
    view.add([dict(out, index=2, step=3)])  # a token: no panel's input changed, but the newest pass moved
    assert not set(view.due(10.0 + ONE_PASS_EVERY / 2)) & set(ONE_PASS)  # within the group's period: none of them
    due = set(view.due(10.0 + ONE_PASS_EVERY + 0.01)) & set(ONE_PASS)
    assert "embedding" in due, due  # its rows did not change; the pass it names did
