"""Issue 42, item 2: the panels (Request, Prefix cache, Tokens, Embedding, Attention, Answer,
Choices, the selected pass and the frozen warning, the MLA formula) in Chinese from the
catalogs, with the request's numbers; token text escaped; English as it was."""
from __future__ import annotations

import re

from tests.trace_views import MODEL, view
from visualizers import answer_html, prefix_cache_html, tokens_html
from visualizers.choices import choices_html
from visualizers.kv_latent import latent_formula_html
from visualizers.selection import frozen_html, select_pass

LATIN = re.compile(r">[^<]*[A-Za-z]{4,}[^<]*<")


def zh_view():
    v = view()
    v.lang = "zh_CN"
    return v


def test_the_trace_views_panels_in_chinese():
    v = zh_view()
    emb, att = v.render("embedding"), v.render("attention")
    assert "<div class=\"tt-title\">嵌入</div>" in emb and "形状 <b>[6 个词元 × d_model 8]</b>" in emb, emb[:600]
    assert "已选中：读入 <code>.</code>（位置 5）并预测出" in emb, emb[:900]
    assert "已记录的 2 层中的第 <b>0</b> 层 · 查询头 <b>0</b> · 2 个查询头共用 1 个 KV 头" in att, att[:1500]
    assert "查询 ↓<br>键 →" in att and "query ↓" not in att
    english = view()
    assert "shape <b>[6 tokens × d_model 8]</b>" in english.render("embedding")


def test_prefix_answer_and_choices_in_chinese():
    hit = prefix_cache_html({"prompt_tokens": 40, "cached_tokens": 32, "hit": True, "cached_blocks": [1, 2],
                             "full_blocks": 3}, 16, lang="zh_CN")
    assert "复用的词元：提示 40 个词元中的 <b>32</b> 个" in hit and "<b>80%</b>" in hit, hit
    assert "提示的 3 个整块（每块 16 个词元）中的 <b>2</b> 个（ID 1, 2）" in hit and ">命中<" in hit, hit
    ans = answer_html([{"index": 0, "token_id": 3, "text": "<b>", "t": 0.1, "latency": 0.1}],
                      {"reason": "stop", "usage": {"prompt_tokens": 3, "completion_tokens": 1, "cached_tokens": 0}},
                      lang="zh_CN")
    assert "词元：<b>1</b> · 首个词元于 <b>100.0 ms</b>" in ans and "结束：<b>stop</b>" in ans, ans
    assert "&lt;b&gt;" in ans and "<div class=\"tt-title\">回答</div>" in ans
    two = choices_html([[{"token_id": 1, "text": "a"}, {"finished": True, "finish_reason": "length"}], []], 2,
                       lang="zh_CN")
    assert "2 个候选回答" in two and "结束：length（达到最大词元数）" in two and "在等第一个词元" in two, two


def test_a_chinese_prompt_split_into_byte_pieces_is_said_in_chinese():
    toks = [{"id": i, "text": t, "piece": t, "special": False}
            for i, t in enumerate(["你", "<0xE5>", "<0xA5>", "<0xBD>", "世界"])]
    zh = tokens_html({"tokens": toks, "count": 5, "vocab_size": 100}, [], lang="zh_CN")
    assert "提示词元：<b>5</b>（特殊 0 个） · 生成：<b>0</b> · 词表：<b>100</b> 个 logits" in zh and ">特殊 / 角色<" in zh
    assert "中文：<b>4</b> 个字符，占 <b>5</b> 个词元（在这个模型上平均每个词元 <b>0.8</b> 个字）" in zh, zh
    assert "1 个字被拆成字节片段，1 个词元包含好几个完整的字：" in zh and "字节 E5：好（U+597D）3 个字节中的 1 个" in zh
    assert "好 U+597D：3 个字节，分在 3 个词元里" in zh  # the character's hover over its pieces


def test_the_selection_the_frozen_warning_and_the_mla_formula_in_chinese():
    sel = select_pass(["a", "<x>", "c"], 0, 1, "zh_CN")
    assert sel.words() == "读入 <code>a</code>（位置 0）并预测出 <code>&lt;x&gt;</code>（位置 1）的那遍前向计算"
    frozen = frozen_html({"limit_bytes": 2 ** 20, "step": 7}, 1, ["a", "b"], "attention captures", "zh_CN")
    assert "⚠ 已冻结：它的注意力记录停在在位置 1 的词元 <code>b</code>之后（第 7 个引擎步）" in frozen, frozen
    m = {"mla": {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128},
         "num_layers": 2, "dtype_bytes": 2, "num_heads": 16, "kv_bytes_per_token": 2304, "num_blocks": 100,
         "block_size": 16, "dtype": "bfloat16", "kv_cache_bytes": 3686400}
    zh = latent_formula_html(m, 37, lang="zh_CN")
    assert "= <b>每个词元 2,304 B</b>，即 KV 池自己的计数（计算器的公式给出同样的结果）" in zh, zh
    assert "这个请求：2,304 B × 37 个词元" in zh and "<b>2,304 B per token</b>" in latent_formula_html(m, 37)
    assert MODEL["name"] == "m"


def test_the_words_the_pages_scripts_write_come_from_the_catalogs():
    """hover.js fills the attention overview's templates from the panel's spec, glyphs.js its note
    from window.TT_WORDS: both in the page's language, each placeholder kept."""
    from app.page.layout import JS_WORDS
    from visualizers.attention_overview import hover_words
    zh, en = hover_words("zh_CN"), hover_words("en")
    assert en["most"] == "{head} attends most to {keys} · {ctx}" and "最关注" in zh["most"]
    for k in en:
        assert set(re.findall(r"\{\w+\}", zh[k])) == set(re.findall(r"\{\w+\}", en[k])), k
    assert "{text}" in JS_WORDS["zh-CN"]["noGlyph"] and "字体" in JS_WORDS["zh-CN"]["noGlyph"]


def test_the_routers_reasons_in_chinese():
    """The lab's routing figure: the router's reasons (written in English into the result) said in the
    figure's language; a form it does not know stays as written."""
    from visualizers.lab_routing import route_reason
    said = route_reason("zh_CN", "no replica holds a prefix of it: least loaded (2 in flight)")
    assert said == "没有哪个副本缓存了它的前缀：负载最轻（2 个正在处理）", said
    assert route_reason("zh_CN", "holds the longest cached prefix (32 tokens)") == "缓存的前缀最长（32 个词元）"
    assert route_reason("zh_CN", "loads 0..5 too far apart: its turn") == "负载 0..5 相差太大：轮到它"
    assert route_reason("en", "its turn") == "its turn" and route_reason("zh_CN", "new reason") == "new reason"
