"""Issue 42 item 4 in a real Chromium: the Tokens panel of a Chinese prompt on SmolLM2 and on
Gemma 3 (their real tokenizers, the page's own CSS). Each character box sits above the chips of
exactly the pieces it spans (SmolLM2 splits 句 over two, keeps 用 whole); Gemma 3 draws no box,
its whole words one chip each; a font draws the characters (fonts-noto-cjk, .ci/run). The
screenshots go to $TOKENTRACE_SCREENSHOTS.

Without Chromium or Playwright these tests skip, unless TOKENTRACE_REQUIRE_BROWSER=1."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from app.page.layout import CSS
from engine.tokenizer import Tokenizer
from tests.browser_utils import REQUIRE, browser_or_skip
from tests.real_models import cached_gguf
from visualizers.tokens import tokens_html

pytestmark = [pytest.mark.slow]
SYSTEM, USER = "你是一个简洁的助手。", "用一句话解释 KV 缓存。"

# each character box: its text, how many tokens its title says it spans, and the chips under it
BOXES = """() => [...document.querySelectorAll('.tt-run')].flatMap(run => {
  const chips = [...run.querySelectorAll('.tt-chip')].map(c => c.getBoundingClientRect());
  return [...run.querySelectorAll('.tt-char')].map(box => {
    const b = box.getBoundingClientRect();
    const under = chips.filter(c => c.left < b.right - 1 && c.right > b.left + 1);
    const said = (box.title.match(/over (\\d+) tokens/) || [0, 1])[1];
    return {text: box.textContent, said: +said, under: under.length, width: b.width,
            above: under.every(c => b.bottom <= c.top + 1)};
  });
})"""


@pytest.fixture(scope="module")
def server():
    """No server: the panel is drawn from the tokenizers alone (the browser fixture asks for one)."""
    browser_or_skip()
    if not shutil.which("fc-list") or not subprocess.run(["fc-list", ":lang=zh"], capture_output=True,
                                                          text=True).stdout.strip():
        (pytest.fail if REQUIRE else pytest.skip)("no Chinese font (apt-get install -y fonts-noto-cjk)")
    yield None


def shot(browser, shots, name: str, tok: Tokenizer, ids: list[int]) -> tuple:
    toks = tok.pieces(ids)
    html = tokens_html({"tokens": toks, "count": len(toks), "vocab_size": tok.vocab_size,
                        "chat_template": tok.has_chat_template})
    page = browser.new_page(viewport={"width": 900, "height": 500})
    try:
        page.set_content(f"<html><head><meta charset='utf-8'><style>{CSS}</style></head>"
                         f"<body style='font-family: sans-serif'>{html}</body></html>")
        page.screenshot(path=str(shots / f"tokens-zh-{name}.png"), full_page=True)
        # a drawn CJK character is about as wide as it is tall; a missing glyph's box or nothing is not
        width = page.evaluate("() => { const s = document.createElement('span'); s.textContent = '缓存缓存';"
                              " s.style.fontSize = '20px'; document.body.append(s); return s.offsetWidth; }")
        return page.evaluate(BOXES), width
    finally:
        page.close()


def test_smollm2_draws_each_split_character_over_exactly_its_pieces(browser, shots):
    tok = Tokenizer(cached_gguf("smollm2"))
    boxes, width = shot(browser, shots, "smollm2", tok, tok.encode_chat(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]))
    assert width >= 70  # four characters of a real font at 20 px
    split = [b for b in boxes if b["said"] > 1]
    assert len(split) == 10 and {"句", "话", "解", "释", "缓"} <= {b["text"] for b in split}
    assert all(b["under"] == b["said"] and b["above"] for b in boxes), boxes


def test_gemma3_draws_its_whole_words_as_one_chip_each(browser, shots):
    tok = Tokenizer(cached_gguf("gemma3-270m"))
    boxes, width = shot(browser, shots, "gemma3", tok, tok.encode(SYSTEM + USER))
    assert width >= 70 and boxes == []
