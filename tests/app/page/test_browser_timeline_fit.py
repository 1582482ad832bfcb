"""The timeline's TTFT label in a real Chromium with the page's own CSS: it sits at its line and
never leaves the plot, however late the first token comes (a 1,234.5 ms TTFT near the axis's end
pushed the panel 9 px past a 420 px phone's screen in CI).

Without Chromium or Playwright these tests skip, unless TOKENTRACE_REQUIRE_BROWSER=1."""
from __future__ import annotations

import pytest

from app.page.layout import CSS
from tests.browser_utils import browser_or_skip
from visualizers.timeline import timeline_html

pytestmark = [pytest.mark.slow]
RID = "req-1"
PLACE = """() => { const plot = document.querySelector('.tt-tl-plot').getBoundingClientRect();
  const label = document.querySelector('.tt-ttft').getBoundingClientRect();
  const line = document.querySelector('svg line[stroke="#d62828"]').getBoundingClientRect();
  const panel = document.querySelector('.tt-panel');
  return {plot: [plot.left, plot.right], label: [label.left, label.right], line: line.left,
          hidden: panel.scrollWidth - panel.clientWidth}; }"""


@pytest.fixture(scope="module")
def server():
    """No server: the panel is drawn from events alone (the browser fixture asks for one)."""
    browser_or_skip()
    yield None


def events(ttft: float, decode: int = 6, step: float = 0.02) -> list[dict]:
    """A request whose first token came at ttft s, then `decode` steps of `step` s each."""
    out = [{"type": "tokenize", "request_id": RID, "ts": 0.004, "seconds": 0.004},
           {"type": "request.arrive", "request_id": RID, "ts": 0.004},
           {"type": "schedule.step", "step": 1, "ts": ttft, "forward_seconds": ttft - 0.01, "num_tokens": 24,
            "batch": [{"request_id": RID, "kind": "prefill", "num_tokens": 24}]},
           {"type": "token", "request_id": RID, "index": 0, "ts": ttft, "t": ttft}]
    for k in range(1, decode + 1):
        ts = ttft + k * step
        out += [{"type": "schedule.step", "step": 1 + k, "ts": ts, "forward_seconds": step, "num_tokens": 1,
                 "batch": [{"request_id": RID, "kind": "decode", "num_tokens": 1}]},
                {"type": "token", "request_id": RID, "index": k, "ts": ts, "t": ts}]
    return out


@pytest.mark.parametrize("ttft", [0.0824, 1.2345, 12.3456])
@pytest.mark.parametrize("width", [420, 1280])
def test_the_ttft_label_stays_at_its_line_inside_the_plot(browser, shots, ttft, width):
    page = browser.new_page(viewport={"width": width, "height": 700})
    try:
        page.set_content(f"<html><head><meta charset='utf-8'><style>{CSS}</style></head><body>"
                         f"<div id='tt-timeline' style='max-width:{width - 90}px'>"
                         f"{timeline_html(events(ttft), RID)}</div></body></html>")
        page.screenshot(path=str(shots / f"timeline-ttft-{width}-{ttft}.png"), full_page=True)
        got = page.evaluate(PLACE)
    finally:
        page.close()
    (plot_left, plot_right), (left, right) = got["plot"], got["label"]
    assert plot_left - 0.5 <= left and right <= plot_right + 0.5, got
    assert got["hidden"] <= 1, got
    # the label begins at its line, or ends at it when the line is past the plot's middle
    assert min(abs(left - got["line"]), abs(right - got["line"])) <= 2, got
