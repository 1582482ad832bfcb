"""Issue 42 item 1 in Chromium: the Experiments tab of a Chinese page (locale zh-CN, ?lang=zh-CN)
runs the batching experiment at size ci on the embedded model; its progress, sentences, table
and figures and the exported HTML page are Chinese, with no English prose left (numbers,
units, model and code words stay); the JSON export keeps its English keys. A screenshot."""
from __future__ import annotations

import json

import pytest

from app.__main__ import build_services, parse_args
from tests.app.lab.english_left import english_words, visible_text
from tests.browser_utils import browser_or_skip, open_page
from tests.service_utils import served

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    browser_or_skip()
    models = build_services(parse_args(["--draft", "none", "--num-kv-blocks", "64"]), say=lambda _: None)
    with served(models, tmp_path_factory) as srv:
        yield srv


def test_a_chinese_tab_runs_an_experiment_and_exports_it_in_chinese(server, browser, shots):
    context = browser.new_context(locale="zh-CN", viewport={"width": 1400, "height": 1100}, accept_downloads=True)
    page = open_page(context, server.url.rstrip("/") + "/?lang=zh-CN")
    page.click("#tt-tab-lab-button, button[role=tab]:has-text('实验')")
    page.wait_for_selector("#tt-lab-run")
    page.wait_for_function("document.querySelector('#tt-lab-exp input').value === '静态批处理与连续批处理'")
    assert page.input_value("#tt-lab-model input") == "内置模型" and "每个实验都在真实的引擎上" in \
        page.inner_text("#tt-lab-intro-box")  # the pickers' choices and the intro, translated
    page.click("#tt-lab-run")  # the first experiment: static vs continuous batching
    page.wait_for_selector("#tt-lab-figures", timeout=240_000)
    frame = page.frame_locator("#tt-lab-figures")
    frame.locator("body[data-drawn]").wait_for(timeout=60_000)
    said = page.inner_text("#tt-lab-result-box")
    assert "请求同时到达时，连续批处理用" in said and "静态，同时到达" in said, said
    assert "用时" in page.inner_text("#tt-lab-progress-box")
    with page.expect_download() as got:
        page.locator("#tt-lab-json a").first.click()
    result = json.loads(open(got.value.path()).read())
    allowed = {result["model"], *english_words(result["machine"].get("platform", ""))}
    assert not english_words(said, allowed), sorted(set(english_words(said, allowed)))
    assert result["sentences"][0].startswith("Arriving together")  # the JSON: English, as every result file
    assert "CPU 时间、总完成时间和延迟" in frame.locator("#fig0").inner_text()  # plotly drew the Chinese title
    with page.expect_download() as got:
        page.locator("#tt-lab-html a").first.click()
    exported = visible_text(open(got.value.path(), encoding="utf-8").read())
    assert "静态批处理与连续批处理" in exported and not english_words(exported, allowed)
    page.locator("#tt-lab-result-box").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "lab_tab_batching_zh.png"), full_page=True)
    assert page.external == [] and page.dialogs == []
    context.close()
