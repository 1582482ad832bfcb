"""Issue 42's pattern stage: the Tokenize stage's words come from the catalogs, with this
request's numbers in them, in English as before and in Chinese with its measure word."""
from __future__ import annotations

from tests.trace_views import MODEL
from visualizers.journey import journey

TOK = {"type": "tokenize", "step": 0, "count": 1234, "chat_template": True, "tokenizer_size": 49152,
       "tokens": [{"id": 1, "text": "", "piece": "<|im_start|>", "special": True}]
       + [{"id": 5, "text": "a", "piece": "a", "special": False}] * 1233}


def tokens(lang: str, evs: list[dict], body: dict | None = None):
    return next(s for s in journey(MODEL, "r1", body or {"messages": []}, evs, [], lang=lang) if s.key == "tokens")


def test_the_tokens_stage_in_english_as_it_was():
    st = tokens("en", [TOK])
    assert ("then the tokenizer (byte-pair encoding) cut the text into <b>1,234</b> tokens, each an integer id in a "
            "vocabulary of <b>49,152</b>. <b>1</b> of them is a special token that marks whose turn it is "
            "(highlighted).") in st.text
    assert st.chip == "1,234 tokens" and "The model never sees letters: only these ids." in st.text


def test_the_tokens_stage_in_chinese_with_its_numbers():
    st = tokens("zh_CN", [TOK])
    assert "把文本切成 <b>1,234</b> 个词元，每个词元都是词表（共 <b>49,152</b> 项）里的一个整数 ID。" in st.text, st.text
    assert "里的一个整数 ID。其中 <b>1</b> 个是特殊词元" in st.text and "模型从来看不到文字本身" in st.text
    assert st.chip == "1,234 个词元"
    plain = tokens("zh_CN", [{**TOK, "chat_template": False, "count": 1, "tokens": TOK["tokens"][:1]}],
                   {"prompt": "x"})
    assert "纯文本提示不套聊天模板" in plain.text and plain.chip == "1 个词元"
    assert "A plain prompt" not in plain.text  # (the other stages still speak English: the next step)
