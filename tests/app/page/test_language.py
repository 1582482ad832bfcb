"""Issue 42, the page's and the classroom's chrome in the tab's (the screen's) language: the
built page's texts that have catalog entries are set per tab by the load and the switch; a
classroom screen is rendered in its own browser's language; the language a request asks for."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import gradio as gr

from app.classroom.page import page_html
from app.classroom.rooms import Room
from app.classroom.words import script_text
from app.page import language
from app.page.layout import build_page
from app.serving.recording import Recording

JOURNEY_CHROME = {"tt-send": "发送", "tt-stop": "停止", "tt-temperature": "温度（0 = 贪心）", "tt-model": "模型",
                  "tt-speculative": "推测解码", "tt-tab-journey": "请求之旅", "tt-load": "载入追踪记录",
                  "tt-class-start": "课堂", "tt-play": "▶ 播放", "tt-layer": "层", "tt-head": "查询头",
                  "tt-status": "状态", "tt-tab-library": None}


def request(query: dict | None = None, **headers) -> SimpleNamespace:
    return SimpleNamespace(query_params=query or {}, headers={k.replace("_", "-"): v for k, v in headers.items()})


def test_the_page_chrome_in_chinese(recording: Recording):
    page = build_page(None, recording)
    chrome = language.chrome_of(page)
    by_id = {getattr(b, "elem_id", None): b for b, _ in chrome}
    updates = language.chrome_updates("zh_CN", chrome)
    for elem, zh in JOURNEY_CHROME.items():
        if zh is None:
            continue
        assert elem in by_id, elem
        said = {k: v for k, v in updates[by_id[elem]].items() if k != "__type__"}
        assert zh in said.values(), (elem, said)
    header = next(u for b, u in updates.items() if getattr(b, "elem_id", None) == "tt-header")["value"]
    assert "一个请求的每个阶段，边发生边画出来。" in header and "<h1>TokenTrace" in header
    back = language.chrome_updates("en", chrome)  # the switch back: the built page's English
    assert back[by_id["tt-send"]]["value"] == "Send" and back[by_id["tt-temperature"]]["label"] == \
        "Temperature (0 = greedy)"
    # values the handlers read (the replay speed, JSON mode, the capture level) are never translated; a
    # picker marked as translated (the Experiments tab's) has its shown words translated, its values kept
    assert not any("value" in u or ("choices" in u and language.TRANSLATED not in (b.elem_classes or []))
                   for b, u in updates.items() if isinstance(b, (gr.Dropdown, gr.Radio, gr.Slider, gr.Textbox)))
    picked = [(b, u["choices"]) for b, u in updates.items() if "choices" in u]
    assert picked and all([v for _, v in c] == [v for _, v in b.choices] for b, c in picked)
    assert any(("静态批处理与连续批处理", "batching") in c for _, c in picked), picked


def test_the_language_a_page_load_asks_for():
    assert language.of_request(request(accept_language="zh-CN,zh;q=0.9")) == "zh_CN"
    assert language.of_request(request(accept_language="zh-CN", cookie="a=1; tt_lang=en")) == "en"
    assert language.of_request(request({"lang": "zh-CN"}, accept_language="en", cookie="tt_lang=en")) == "zh_CN"
    assert language.of_request(request(cookie="bad;;=")) == "en"
    language.set_lang("tab-1", "zh_CN")
    language.set_lang("tab-2", "en")  # two tabs, two languages
    assert language.tx("tab-1", "Send") == "发送" and language.tx("tab-2", "Send") == "Send"
    assert language.ntx("tab-1", "{request}: finished ({reason}), {n} token",
                        "{request}: finished ({reason}), {n} tokens", 3, request="r", reason="stop") == \
        "r：已结束（stop），共 3 个词元"


def test_a_classroom_screen_in_its_own_language(recording: Recording):
    room = Room("r", "k", recording)
    zh, en = page_html(room, True, "", lang="zh_CN"), page_html(room, True, "")
    for text in ("下一步 →", "← 上一步", "显示回答", "TokenTrace 课堂", "本请求跳过的阶段：",
                 'lang="zh-CN"', "主讲人：→ / ← / 空格 / PageDown 带全班翻页"):
        assert text in zh, text
    assert "Next →" in en and "Next →" not in zh and 'lang="en"' in en
    config = json.loads(re.search(r"const CONFIG = (.*);\n", zh).group(1))
    assert config["text"]["Predict the next token"] == "预测下一个词元"
    assert config["text"]["{n} vote so far"] == ["目前共 {n} 票"]  # one plural form
    assert config["langCookie"] == "tt_lang" and json.loads(re.search(r"const CONFIG = (.*);\n", en).group(1))[
        "text"] == {}
    assert script_text("en") == {} and not [k for k, v in script_text("zh_CN").items() if not v]


def test_a_handler_s_labels_in_the_tab_s_language():
    """A model picked rewrites the prompt boxes' labels: in the tab's language too."""
    named = {"user": gr.update(label="User prompt"), "system": gr.update(label="System prompt", interactive=True),
             "max_tokens": gr.update(label="Max tokens (≤ 512, the server's cap)"), "status": "x"}
    zh = language.localized("zh_CN", named)
    assert zh["user"]["label"] == "用户提示词" and zh["system"]["label"] == "系统提示词" and zh["system"]["interactive"]
    assert zh["max_tokens"]["label"] == named["max_tokens"]["label"] and zh["status"] == "x"  # no entry: as it was
    assert language.localized("en", named) is named
