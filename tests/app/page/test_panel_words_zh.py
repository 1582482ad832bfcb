"""Issue 42: the KV cache, Sampling, Logit lens, Timeline, Speculative decoding and MoE panels
speak the tab's language. A real request of the embedded model (a Chinese prompt, speculative,
traced at full; a tiny Mixtral for the MoE panel) is drawn by the page's own LiveView in
Chinese: each panel shows its Chinese words with this request's numbers, and none of the
English sentences its module marks for the catalogs is left in it.
The page threads the language: a tab's language switch redraws the panels, and a Send from a
Chinese tab streams Chinese panels."""
from __future__ import annotations

import html
import re

import pytest

from app.page import texts
from app.page.controller import Controller, Controls
from app.page.live_view import LiveView
from app.page.page_state import stages_of
from app.page.tabs import set_lang
from tests.service_utils import app_service, run_to_end, started
from app.serving.requests import build_body
from visualizers.disagg import disagg_html
from visualizers.kv_calculator import calculator_html
from visualizers.i18n.extract import template

pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")
PANELS = {"kv": "visualizers/kv_", "sampling": "visualizers/sampling.py", "logit_lens": "visualizers/logit_lens.py",
          "timeline": "visualizers/timeline.py", "spec": "visualizers/speculative.py",
          "moe": "visualizers/moe.py", "parallel": "visualizers/parallel.py"}  # panel -> the module(s) whose
# marked texts it draws
USER = "用一句话解释 KV 缓存。"


@pytest.fixture(scope="module")
def embedded():
    with started(app_service(None, model=None)) as svc:
        yield svc


def run_view(svc) -> LiveView:
    """The page's view of one finished request (the article's system prompt, a Chinese question)."""
    body = build_body("m", "You are a concise assistant.", USER, 0.8, 0, 1.0, 6, 3, True, 2, "full")
    rid, items = run_to_end(svc, body | {"ignore_eos": True})
    v = LiveView(model=texts.with_defaults(svc.model_info()), piece=svc.piece, is_special=svc.is_special)
    v.request_id, v.body = rid, body
    v.add(items)
    assert v.finished and v.by_type.get("sample") and v.by_type.get("logit_lens")
    return v


@pytest.fixture(scope="module")
def view(embedded) -> LiveView:
    v = run_view(embedded)
    assert v.by_type.get("spec")  # the embedded draft proposed
    return v


@pytest.fixture(scope="module")
def moe_view(checkpoint) -> LiveView:
    with started(app_service(checkpoint, model="mixtral")) as svc:
        v = run_view(svc)
    assert v.by_type.get("moe")
    return v


def english_of(prefix: str) -> list[str]:
    """The fixed English fragments (two words or more) of every text the module marks."""
    out = []
    for m in template():
        if not m.id or not any(path.startswith(prefix) for path, _ in m.locations):
            continue
        for msgid in (m.id if isinstance(m.id, tuple) else (m.id,)):
            out += [f.strip() for f in re.split(r"\{\w*\}", msgid) if len(re.findall(r"[A-Za-z]{2,}", f)) >= 2]
    return out


def drawn(v: LiveView, name: str, lang: str) -> str:
    v.lang = lang
    return html.unescape(v.render(name))


def test_each_panel_speaks_chinese_with_this_requests_numbers(view):
    kv = drawn(view, "kv", "zh_CN")
    assert "KV 缓存" in kv and "整个块池" in kv and "块表：" in kv and "KV 字节数 = 2 × 层数" in kv, kv[:600]
    n_blocks = view.kv_pool()["num_blocks"]
    assert f"块池：{n_blocks:,} 个块 × 每块" in re.sub(r"<[^>]+>", "", kv)
    samp = drawn(view, "sampling", "zh_CN")
    n_draws = len(view.by_type["sample"])
    assert "采样" in samp and f"（共 {n_draws} 个）" in samp and "抽到：" in samp and "每个环节之后留下的词元数" in samp
    assert "词表中" in samp and "熵 " in samp
    lens = drawn(view, "logit_lens", "zh_CN")
    layers = view.model["num_layers"]
    assert "逻辑透镜 (logit lens)" in lens and f"第 {layers - 1} 层 = 输出" in lens and "嵌入" in lens and "选中" in lens
    tl = drawn(view, "timeline", "zh_CN")
    steps = {e["step"] for e in view.by_type["schedule.step"]}
    assert "时间线" in tl and "个预填充分块" in tl and "TTFT" in tl and "排队（从到达到被调度器接纳）" in tl, tl[:800]
    assert re.search(rf"{len(steps)} 个引擎步", tl), tl[:800]
    spec = re.sub(r"<[^>]+>", "", drawn(view, "spec", "zh_CN"))
    rounds = len(view.by_type["spec"])
    assert "推测解码" in spec and f"轮数：{rounds} · 提议" in spec and "接受率" in spec and "草稿词元 → 目标模型的词元" in spec


def test_the_moe_panel_speaks_chinese(moe_view):
    moe = re.sub(r"<[^>]+>", "", drawn(moe_view, "moe", "zh_CN"))
    layers = sorted({e["layer"] for e in moe_view.by_type["moe"]})
    assert "混合专家（MoE）" in moe and f"第 {layers[0]} 层（共捕获 {len(layers)} 个 MoE 层）" in moe, moe[:600]
    assert "专家负载（本请求，" in moe and "被选 " in moe and "路由权重" in moe


def test_one_device_and_the_handover_in_chinese(view):
    par = re.sub(r"<[^>]+>", "", drawn(view, "parallel", "zh_CN"))
    assert "并行" in par and "这个模型在一个设备上运行" in par and "流水线并行" in par and "8 个设备上" in par, par
    x = {"type": "kv.transfer", "num_blocks": 3, "tokens": 40, "bytes": 3 * 16 * 2048, "layers": [0, 1],
         "backend": "gloo", "wire_ms": 0.5, "queue_ms": 2.0, "prefill_ms": 20.0, "handover_ms": 3.0, "src": "prefill 0",
         "dst": "decode 1", "src_blocks": [0, 1, 2], "dst_blocks": [5, 6], "src_pool": {"num_blocks": 64, "free": 64},
         "dst_pool": {"num_blocks": 64, "free": 60, "cached": 0}}
    zh = re.sub(r"<[^>]+>", "", disagg_html([x, {"type": "finish", "ttft": 0.030}], "zh_CN"))
    assert "预填充与解码分离" in zh and "在 预填充引擎 0 上计算" in zh and "传到 解码引擎 1" in zh and "交接占了" in zh, zh
    assert not [e for e in english_of("visualizers/disagg.py") if e in zh]
    calc = calculator_html(2000, "float16", lang="zh_CN")  # the KV section's calculator, redrawn in the tab's language
    assert "2 × 32 层 × 8 个 KV 头 × 128 维 × 2,000 个词元 × 2 B" in calc and "不用潜向量时" in calc and "公式" in calc


def test_the_code_that_ran_says_it_in_chinese(view):
    """The lines each stage's "code that ran" adds to its words (code_facts): in the tab's language."""
    zh = {st.key: st.text for st in stages_of(view, "zh_CN")}
    en = {st.key: st.text for st in stages_of(view, "en")}
    assert "Ran for this request:" in en["layers"] and "Its values:" in en["sampling"]
    assert "本请求实际运行的：" in zh["layers"] and "这里没有走的路径：" in zh["layers"], zh["layers"][-600:]
    assert "它的取值：" in zh["sampling"] and "抽到 p = " in zh["sampling"] and "最后一轮：" in zh["spec"]
    assert "页面上的发送" in zh["request"] and "由草稿模型提议 k 个词元" in zh["spec"]  # the ways' names (the code map's)
    assert not [w for w in ("Ran for this request", "Its values", "Not taken here", "proposals accepted", "drew p")
                if w in zh["layers"] + zh["sampling"] + zh["spec"]]


@pytest.mark.parametrize("name", list(PANELS))
def test_no_english_sentence_of_the_panel_is_left_in_chinese(view, moe_view, name):
    english = english_of(PANELS[name])
    assert len(english) >= 5  # the module's texts are marked (the check below reads them)
    v = moe_view if name == "moe" else view
    en, zh = drawn(v, name, "en"), drawn(v, name, "zh_CN")
    assert [e for e in english if e in en]  # the English panel draws some of them...
    assert not [e for e in english if e in zh]  # ... the Chinese one none


def test_a_language_switch_redraws_the_panels_and_send_streams_them_in_it(embedded):
    ctl = Controller(embedded)
    set_lang("zh-tab", "zh_CN")
    opened = ctl.opening_page("zh-tab", True)  # the load (or the switch) of a Chinese tab: its panels in Chinese
    assert "还没有采样任何词元" in opened["sampling"] and "KV 缓存" in opened["kv"]
    set_lang("zh-tab", "en")  # the switch back: English again
    assert "no token sampled yet" in ctl.opening_page("zh-tab", True)["sampling"]
    assert "no token sampled yet" in ctl.blank.render("sampling")  # the blank view, every tab's, stays English
    set_lang("zh-tab", "zh_CN")
    c = Controls(user=USER, max_tokens=3, seed="1", level="full", model=ctl.model["name"], speculative=False)
    last = list(ctl.run("zh-tab", c))[-1]
    assert "抽到：" in last["sampling"] and "时间线" in last["timeline"] and "逻辑透镜" in last["logit_lens"]
    assert last["step"]["label"].startswith("回放：本请求的第 1..")  # the replay bar's label, in the tab's language


def test_the_words_around_the_controls_follow_the_tabs_language(embedded):
    ctl = Controller(embedded)
    set_lang("zh-words", "zh_CN")
    words = ctl.page_words("zh-words")  # sent with the panels by a Chinese load and by the switch
    info = ctl.model
    assert f"{info['num_layers']} 层 · d_model" in words["summary"] and "KV 块池" in words["summary"]
    assert words["max_tokens"]["label"].startswith("最大词元数（≤") and "真实模型：" in words["note"]
    assert words["speculative"]["label"] == "推测解码" and "草稿模型" in words["speculative"]["info"]
    assert "还没有可回放的内容" in words["step_note"] and words["step"]["label"].startswith("回放：")
    assert "这个阶段的代码：engine/" in words["code:prefix"] and "，另有 " in words["code:prefix"]
    set_lang("zh-words", "en")
    assert f"{info['num_layers']} layers · d_model" in ctl.page_words("zh-words")["summary"]
    set_lang("zh-words", "zh_CN")
    picked = ctl.pick_model("zh-words", Controls(model=info["name"]))
    assert "点击发送将发给这个模型" in picked["status"] and "最大词元数" in picked["max_tokens"]["label"]
