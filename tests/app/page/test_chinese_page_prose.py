"""Issue 42, item 6: the Chinese page shows no English prose outside token texts, code, JSON
and model names. A real request on the embedded model, sent through the page's Controller by
a tab whose language is Chinese (no browser: every update folded as the browser folds them),
the blank page's load included; each panel and stage it covers is read for Latin words
(tests/app/page/chinese_prose.py says which are kept) and every one left is named.

Covered: every panel, stage sentence, hint and line the page's updates carry (the map, Status,
the replay's notes), with speculation on so that its stage and panel speak too; not the export
buttons' file paths."""
from __future__ import annotations

import pytest

from app.page.controller import Controller, Controls
from app.page.live_view import PANELS
from app.page.tabs import set_lang
from tests.app.page.chinese_prose import english
from tests.service_utils import app_service, started
from visualizers.journey import KEYS

pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")

NOT_PROSE = {"export", "export_timeline"}  # the exports' file paths


@pytest.fixture(scope="module")
def service():
    with started(app_service(None, model=None)) as svc:  # the embedded model (and its draft)
        yield svc


def value(v):
    return v.get("value") if isinstance(v, dict) else v


def fold(screen: dict, update: dict, prefix: str = "") -> None:
    for name, v in update.items():
        if isinstance(value(v), str):
            screen[prefix + name] = value(v)


def offenders(screen: dict, names: set[str]) -> dict[str, list[str]]:
    bad = {n: sorted(set(english(screen[n], names))) for n in screen if n.removeprefix("idle:") not in NOT_PROSE}
    return {n: words for n, words in bad.items() if words}


def test_the_chinese_page_has_no_english_prose_before_during_and_after_a_request(service):
    ctl = Controller(service)
    set_lang("zh-prose", "zh_CN")
    names = {ctl.model["name"]}
    screen: dict = {}
    fold(screen, ctl.opening_page("zh-prose", True), "idle:")  # the load in Chinese: the blank page's panels too
    assert {f"idle:{p}" for p in PANELS} <= set(screen), sorted(screen)
    mid: dict = {}
    c = Controls(user="用一句话解释 KV 缓存。", max_tokens=8, level="full", model=ctl.model["name"], speculative=True, k=3)
    for update in ctl.run("zh-prose", c):
        fold(screen, update)
        if "stage:tokens" in screen and not mid:
            mid = dict(screen)  # the first picture with the request's own words
    assert "已结束" in screen["status"], screen["status"]
    assert "个词元" in screen["stage:tokens"] and "提示词元" in screen["tokens"], screen["tokens"][:400]
    assert {p for p in PANELS} <= set(screen) and {f"stage:{k}" for k in KEYS} <= set(screen), sorted(screen)
    bad = offenders(screen, names) or offenders(mid, names)
    assert not bad, bad
    # the same page in English: the check finds its words (it can fail)
    set_lang("zh-prose", "en")
    english_page = ctl.opening_page("zh-prose", True)
    assert "prompt tokens:" in value(english_page["tokens"]) and offenders(
        {n: value(v) for n, v in english_page.items() if isinstance(value(v), str)}, names)


def test_a_refused_request_in_chinese_keeps_the_apis_reason(service):
    """Item 5: the page's words about a refused request are Chinese; the API's reason stays as the
    API gives it (OpenAI clients parse it)."""
    ctl = Controller(service)
    set_lang("zh-refused", "zh_CN")
    screen: dict = {}
    for update in ctl.run("zh-refused", Controls(user="   ", model=ctl.model["name"])):
        fold(screen, update)
    assert "被拒绝：the user message is empty" in screen["status"], screen["status"]
    assert "⚠ 未发送：the user message is empty" in screen["hint_prompt"], screen["hint_prompt"]
    assert "未发送：the user message is empty" in screen["answer"] and "✗ 被拒绝：the user message is empty" in \
        screen["request"], screen["request"][-600:]
    assert not english(screen["request"].replace("the user message is empty", ""), {ctl.model["name"]})
