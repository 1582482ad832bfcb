"""Hover and click in a real Chromium: the attention map, the embedding rows and the KV pool
name the cell under the pointer with the trace's exact value (read back from GET
/v1/traces/{id}) and what its row and column are; MoE and logit-lens cells carry the same in
their titles; the attention overview names each layer and head and a click on it asks for that
head; clicking a token chip selects the pass that read it in every panel, named the same way.

Without Chromium or Playwright these tests skip, unless TOKENTRACE_REQUIRE_BROWSER=1."""
from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.browser_utils import chromium, open_page, paced_server, server_fixture, set_controls, wait_finished
from visualizers._html import prob
from visualizers.attention_rows import key_positions
from visualizers.compact import array, lens_layers, per_layer

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")]


server = server_fixture(delay=0.01)


def hover_cell(page, selector: str, row: int, col: int) -> str:
    """Move the pointer to the centre of cell (row, col) of a hover map; -> the tip's text."""
    page.locator(selector).scroll_into_view_if_needed()
    box = page.locator(selector).bounding_box()  # in the viewport's coordinates
    spec = json.loads(page.get_attribute(selector, "data-tt-hover"))
    page.mouse.move(box["x"] + (col + 0.5) * box["width"] / spec["w"], box["y"] + (row + 0.5) * box["height"] / spec["h"])
    page.wait_for_function("document.querySelector('#tt-hover-tip') && "
                           f"document.querySelector('#tt-hover-tip').dataset.row === '{row}' && "
                           f"document.querySelector('#tt-hover-tip').dataset.col === '{col}'", timeout=60_000)
    return page.inner_text("#tt-hover-tip")


def test_every_matrix_answers_hover_and_a_token_click_selects_it(server, tmp_path):
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1500, "height": 1100})
        page = open_page(context, server.url)
        set_controls(page, "Tell me about foxes", 8)
        page.click("#tt-send")
        status = wait_finished(page)
        rid = status.split(":")[0]
        trace = httpx.get(server.url + f"v1/traces/{rid}", timeout=30).json()
        events = trace["events"]

        # attention: the selected (newest) pass's row, its own key (the diagonal), a masked cell above it;
        # the columns are the kept keys at their true positions (past 64: the first 8, the gap, the newest)
        big = "#tt-attention img.tt-amap-img"
        spec = json.loads(page.get_attribute(big, "data-tt-hover"))
        n = spec["h"]
        lo = int(spec["rows"][0].split()[0])
        pos = lo + n - 1
        col_of = [c.split()[0] for c in spec["cols"]].index  # a key's column: its label starts with its position
        # the last event that computed that row (a verify step recomputes rows after a rejected draft)
        ev = [e for e in per_layer(x for x in events if x["type"] == "attention") if e["layer"] == 0
              and e["q_start"] <= pos < e["q_start"] + len(e["probs"][0])][-1]
        row = ev["probs"][ev["heads"].index(0)][pos - ev["q_start"]]
        at = list(key_positions(ev.get("k_head", 0), ev["k_start"], len(row))).index
        tip = hover_cell(page, big, n - 1, col_of(str(pos)))
        assert tip.startswith(f"query {pos} ") and f"→ key {pos} " in tip, tip
        assert f"weight {row[at(pos)]:.4f}" in tip and "layer 0 · head 0 (KV head 0)" in tip, tip
        key = lo + 1 if n > 2 else lo
        assert f"weight {row[at(key)]:.4f}" in hover_cell(page, big, n - 1, col_of(str(key)))
        assert "masked (causal" in hover_cell(page, big, 0, col_of(str(lo + 1)))
        if ev.get("k_head"):  # position 0, the attention sink, is kept and drawn first
            assert col_of("0") == 0 and f"weight {row[at(0)]:.4f}" in hover_cell(page, big, n - 1, 0)
        # both axes carry the tokens: a row label per position drawn, a column label per key (one for the gap)
        assert page.locator("#tt-attention .tt-amap-r").count() == n
        assert page.locator("#tt-attention .tt-amap-c[data-pos]").count() == sum(c.split()[0].isdigit()
                                                                               for c in spec["cols"])
        page.locator("#tt-attention").screenshot(path=str(tmp_path / "attention_hover.png"))

        # the overview: every layer x head for that query; a click on a cell asks for that layer and head
        cells = "#tt-attention img.tt-ov-img >> nth=0"
        ov = json.loads(page.get_attribute(cells, "data-tt-hover"))
        tip = hover_cell(page, cells, 0, 1)
        assert tip.startswith(f"layer {ov['layers'][0]}") and "attends most to" in tip, tip
        assert f"query head {ov['heads'][1]} (KV head 0) · query {pos} " in tip, tip
        page.evaluate("() => { const d = document.createElement('div'); d.id = 'tt-pick-head';"
                      "d.appendChild(document.createElement('textarea')); document.body.appendChild(d); }")
        page.mouse.down()
        page.mouse.up()
        assert page.input_value("#tt-pick-head textarea").startswith(f"{ov['layers'][0]}:{ov['heads'][1]}:")

        # embedding rows: position 0, dim 3 .. the value the trace holds (column 0 is the selection's gutter)
        emb = next(e for e in events if e["type"] == "embed" and e["start"] == 0)
        tip = hover_cell(page, "#tt-embedding img.tt-embed", 0, 1 + 3)
        assert tip.startswith(f"token 0 (id {emb['token_ids'][0]}) · dim 3 · value {array(emb['rows'])[0][3]:.4f}"), tip

        # the KV pool: block, state, tokens
        assert re.match(r"block 0 · ", hover_cell(page, "#tt-kv img.tt-kv-img", 0, 0))

        # MoE and logit-lens cells: their titles
        moe = page.get_attribute("#tt-moe td.tt-pick", "title")
        assert re.search(r"position \d+ .* → expert \d+ · router weight 0\.\d{4} · layer \d+", moe), moe
        lens = [e for e in events if e["type"] == "logit_lens"]
        newest = lens_layers(lens[-1])[0]  # the panel shows the newest pass until a token is picked
        cell = page.get_attribute("#tt-logit-lens td.tt-lens-cell", "title")
        assert cell == (f"embedding · candidate #1: {newest['top_texts'][0]!r} (id {newest['top_ids'][0]}) · "
                        f"p={prob(newest['top_probs'][0])}"), cell

        # a click on the first generated token selects the pass that read it: every panel shows that one
        # pass and names it the same way (the lens and the draw: the token it predicted, the next one)
        p0 = lens[0]["position"]
        assert "token 8 of 8" in page.inner_text("#tt-logit-lens")  # the newest, before any click
        page.click(f"#tt-tokens [data-pos='{p0}']")
        page.wait_for_function(f"document.querySelector('#tt-logit-lens').innerText.includes('position {p0 + 1}')")
        assert "token 2 of 8" in page.inner_text("#tt-logit-lens")
        page.wait_for_function("document.querySelector('#tt-attention').innerText.includes("
                               f"'query row: position {p0} ')")
        said = {p: page.inner_text(f"#tt-{p} .tt-sel-pass") for p in
                ("embedding", "attention", "kv", "moe", "logit-lens", "sampling")}
        assert len(set(said.values())) == 1, said
        words = said["attention"]
        assert words.startswith("selected: the pass that read ") and f"(position {p0})" in words, said
        assert f"(position {p0 + 1})" in words and f"position {p0 + 1} · " in page.inner_text("#tt-sampling")
        page.locator("#tt-logit-lens").screenshot(path=str(tmp_path / "lens_picked.png"))

        # a phone: the lens's "chosen" column wraps inside its box instead of being cut
        page.set_viewport_size({"width": 420, "height": 900})
        page.wait_for_timeout(400)
        cut = page.evaluate("[...document.querySelectorAll('#tt-logit-lens td.tt-lens-rank, #tt-logit-lens th')]"
                            ".filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.innerText)")
        assert cut == [], cut
        # a large vocabulary's rank (SmolLM2's read "#16,7…" at 420 px, Gemma 3's run to #262,143) fits too
        cut = page.evaluate("""() => { const cells = [...document.querySelectorAll('#tt-logit-lens td.tt-lens-rank')];
          cells.forEach(c => { c.querySelector('.tt-nw').textContent = '#262,143'; });
          return cells.filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.innerText); }""")
        assert cut == [], cut
        context.close()


def test_a_trace_cut_by_its_byte_cap_freezes_each_capture_panel_with_a_warning_in_its_header(checkpoint,
                                                                                            tmp_path_factory):
    """Issue 25 item 1: the only sign was a green line in the Request panel."""
    with paced_server(checkpoint, tmp_path_factory, "--trace-max-bytes-per-request", "60000", delay=0.01) as srv, \
            chromium() as browser:
        page = open_page(browser.new_context(viewport={"width": 1400, "height": 1000}), srv.url)
        set_controls(page, "Tell me a long story about foxes", 40)
        page.click("#tt-send")
        wait_finished(page)
        for panel in ("attention", "embedding", "moe", "logit-lens"):
            head = page.inner_text(f"#tt-{panel} .tt-frozen")
            assert re.match(r"⚠ frozen: its .+ stopped after token .+ at position \d+ \(engine step \d+\): the trace "
                            r"reached the per-request cap of 0\.0572 MiB", head), (panel, head)
            above = page.evaluate(f"document.querySelector('#tt-{panel} .tt-frozen').getBoundingClientRect().top"
                                  f" - document.querySelector('#tt-{panel} .tt-title').getBoundingClientRect().top")
            assert 0 < above < 40, (panel, above)  # in the panel's own header, under its title
        assert page.locator("#tt-sampling .tt-frozen").count() == 0  # the light events went on
        assert page.locator("#tt-request .tt-checks .tt-warn").inner_text().startswith("⚠ trace: truncated")
