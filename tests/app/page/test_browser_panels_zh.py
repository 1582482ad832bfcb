"""Issue 42 in a real Chromium: a Chinese browser (locale zh-CN) sends a request to the tiny
MoE with a draft, and the KV cache, Sampling, Logit lens, Timeline, Speculative decoding and
MoE panels speak Chinese; none of them draws past its own right edge (a wide table scrolls
inside its wrapper). Screenshots land in $TOKENTRACE_SCREENSHOTS when set."""
from __future__ import annotations

import json
import os

import pytest

from tests.browser_utils import open_page, server_fixture, wait_status

pytestmark = [pytest.mark.slow]
server = server_fixture(delay=0.01)
WORDS = {"#tt-kv": "整个块池", "#tt-sampling": "每个环节之后留下的词元数", "#tt-logit-lens": "逻辑透镜",
         "#tt-timeline": "个引擎步", "#tt-spec": "接受率", "#tt-moe": "专家负载"}
# each element of a panel whose box ends right of the panel's, unless a scrolling or clipping box holds it
OVERFLOW = """(sel) => { const root = document.querySelector(sel), edge = root.getBoundingClientRect().right + 1;
  const held = el => { for (let p = el.parentElement; p && p !== root; p = p.parentElement) {
      const o = getComputedStyle(p).overflowX; if (o === 'auto' || o === 'scroll' || o === 'hidden') return true; }
    return false; };
  return [...root.querySelectorAll('*')].filter(el => el.getBoundingClientRect().right > edge && !held(el))
    .map(el => el.tagName + '.' + el.className + ': ' + (el.textContent || '').slice(0, 40)); }"""


def test_the_panels_in_chinese_fit_their_boxes(server, browser, tmp_path):
    shots = os.environ.get("TOKENTRACE_SCREENSHOTS") or str(tmp_path)
    ctx = browser.new_context(locale="zh-CN", viewport={"width": 1400, "height": 900})
    page = open_page(ctx, server.url)
    page.fill("#tt-user textarea", "用一句话解释 KV 缓存。")
    page.click("#tt-send")
    wait_status(page, "已结束")
    page.add_style_tag(content="#tt-map {visibility: hidden}")  # the sticky map would cover a panel's top in its shot
    for sel, word in WORDS.items():
        page.wait_for_function(f"(document.querySelector({sel!r}) || {{innerText: ''}}).innerText.includes({word!r})",
                               timeout=30_000)
        panel = page.locator(sel)
        panel.scroll_into_view_if_needed()
        assert not page.evaluate(OVERFLOW, sel), (sel, page.evaluate(OVERFLOW, sel))
        panel.screenshot(path=os.path.join(shots, f"panel-zh-{sel[4:]}.png"))
    text = page.inner_text("#tt-sampling")
    assert "Sampling" not in text and "tokens kept after" not in text
    # a free block of the pool answers the pointer in Chinese too (hover.js fills the panel's words)
    pool = "#tt-kv .tt-kv-img"
    page.locator(pool).scroll_into_view_if_needed()
    box, spec = page.locator(pool).bounding_box(), json.loads(page.get_attribute(pool, "data-tt-hover"))
    last = spec["n"] - 1
    row, col = divmod(last, spec["w"])
    page.mouse.move(box["x"] + (col + 0.5) * box["width"] / spec["w"], box["y"] + (row + 0.5) * box["height"] / spec["h"])
    page.wait_for_function(f"(document.querySelector('#tt-hover-tip') || {{innerText: ''}}).innerText"
                           f".includes('块 {last} · ')", timeout=30_000)
    assert f"块 {last} · 空闲" == page.inner_text("#tt-hover-tip").strip()
    ctx.close()
