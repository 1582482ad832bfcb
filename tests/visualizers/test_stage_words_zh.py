"""Issue 42's pattern stage: the Tokenize stage's words come from the catalogs, with this
request's numbers in them, in English as before and in Chinese with its measure word."""
from __future__ import annotations

import re

from tests.trace_views import LABELS, MODEL, PROMPT, events
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


# --- the stages converted after Tokenize: each speaks Chinese with this request's numbers -------
LATIN = re.compile(r"[A-Za-z_]{3,}")
CODE = {"MoE", "float", "TTFT", "SwiGLU", "GeGLU", "top", "finish_reason", "stop", "length", "max_tokens", "nats",
        "Softmax", "softmax", "logit", "lens", "KV", "MLP", "ID", "LM", "head", "verify", "SSE", "API", "JSON", "OpenAI"}


def stage(lang: str, key: str, evs: list[dict] | None = None, outputs: list[dict] | None = None, **kw):
    evs = events() if evs is None else evs
    outs = [{"token_id": i, "text": LABELS[i], "finished": False, "index": i - PROMPT, "t": 0.0}
            for i in range(PROMPT, len(LABELS) - 1)] if outputs is None else outputs
    return next(s for s in journey(MODEL, "r1", {"messages": []}, evs, outs, lang=lang, **kw) if s.key == key)


def prose(text: str) -> list[str]:
    """The Latin words of a stage's HTML outside tags, token quotes «…» and [shapes]."""
    plain = re.sub(r"<[^>]+>|«[^»]*»|\[[^\]]*\]", " ", text)
    return [w for w in LATIN.findall(plain) if w not in CODE and not w.startswith("float")]


def test_the_embedding_stage_in_chinese_with_its_numbers():
    en, zh = stage("en", "embedding"), stage("zh_CN", "embedding")
    assert "Each id picks one row of the embedding matrix (<b>50</b> rows × <b>8</b> numbers). This request's" in en.text
    assert "每个 ID 从嵌入矩阵（<b>50</b> 行 × <b>8</b> 个数）里取出一行。这个请求的提示有 <b>4</b> 个词元" in zh.text, zh.text
    assert "即提示的 <b>4</b> 个位置中的 <b>4</b> 个，以及提示之后的 <b>2</b> 个" in zh.text, zh.text
    assert zh.chip == en.chip == "4 × 8" and not prose(zh.text), prose(zh.text)
    cut = stage("zh_CN", "embedding", events() + [{"type": "trace.truncated", "step": 2, "limit_bytes": 1, "token": 5}])
    assert "追踪记录在第 <b>2</b> 个引擎步（第 <b>5</b> 个词元）达到了服务器的大小上限" in cut.text, cut.text


def test_the_sampling_stage_in_chinese_with_its_numbers():
    en, zh = stage("en", "sampling"), stage("zh_CN", "sampling")
    assert ("Softmax turns the <b>50</b> scores into probabilities; then the knobs cut the list (greedy: always the "
            "most likely token, the same answer every time) and one token is drawn.") in en.text
    assert "<b>3</b> draws were traced." in en.text and "In the pass that read «.» (position 5) and predicted «», the engine drew" in en.text
    assert "Softmax 把 <b>50</b> 个分数变成概率；然后由采样参数截短候选列表（贪心：总是选最可能的词元" in zh.text, zh.text
    assert "在读入 «.»（位置 5）并预测出 «» 的那一遍前向计算中，引擎以 <b>0.90</b> 的概率抽中了 «»；这个分布的熵是 <b>0.30</b> nats。" in zh.text, zh.text
    assert "追踪记录里共有 <b>3</b> 次抽取。" in zh.text and zh.chip == en.chip and not prose(zh.text), prose(zh.text)
    hidden = stage("zh_CN", "sampling", [e for e in events() if e["type"] != "sample"], hidden_from=5)
    assert "第 <b>5</b> 个位置的抽取结果先隐藏起来" in hidden.text and hidden.chip == "已隐藏", hidden.text


def test_the_lens_stage_in_chinese_with_its_numbers():
    en, zh = stage("en", "logit_lens"), stage("zh_CN", "logit_lens")
    assert "Over the <b>3</b> traced tokens, <b>3</b> were settled before the last layer" in en.text
    assert en.chip == "top at once" and zh.chip == "一开始就是首选"
    assert "逻辑透镜 (logit lens)" in zh.text and "只看嵌入时，它排第 <b>1</b>。" in zh.text, zh.text
    assert "在追踪到的 <b>3</b> 个词元中，有 <b>3</b> 个在最后一层之前就已确定（中位数：紧接嵌入之后）。" in zh.text
    assert "[3 × hidden] · [hidden × vocab]" in zh.text and not prose(zh.text), prose(zh.text)
    late = [dict(e, layers=[{**e["layers"][0], "chosen_rank": r} for r in (40, 5, 1)]) if e["type"] == "logit_lens"
            else e for e in events()]
    zh = stage("zh_CN", "logit_lens", late)
    assert "直到输出处（最后一层之后）才成为首选" in zh.text and zh.chip == "输出处才成首选", zh.text
    assert "它在第 <b>0</b> 层之后进入前 10 名（只看嵌入时，它排第 <b>40</b>）。" in zh.text, zh.text


def test_the_stream_stage_in_chinese_with_its_numbers():
    fin = {"type": "finish", "step": 3, "reason": "stop", "preemptions": 2,
           "usage": {"prompt_tokens": 4, "completion_tokens": 2, "cached_tokens": 2}}
    toks = [{"type": "token", "step": s, "latency": 0.01 * s} for s in (1, 2, 3)]
    en, zh = stage("en", "answer", events() + toks + [fin]), stage("zh_CN", "answer", events() + toks + [fin])
    assert "Usage: <b>4</b> prompt tokens (<b>2</b> from the prefix cache) and <b>2</b> completion tokens." in en.text
    assert "立刻发出：共 <b>2</b> 个词元。" in zh.text and "用量：提示 <b>4</b> 个词元（其中 <b>2</b> 个来自前缀缓存）" in zh.text
    assert "finish_reason 为 <b>stop</b>" in zh.text and "它被抢占了 <b>2</b> 次。" in zh.text, zh.text
    assert "词元之间的间隔：中位数 25.0 ms，最长 30.0 ms。" in zh.text and not prose(zh.text), prose(zh.text)
    assert en.chip == "2 tokens" and zh.chip == "2 个词元"
    cut = stage("zh_CN", "answer", events() + [{"type": "trace.cut", "position": 5, "asked": True, "ended": True}],
                [{"token_id": 4, "text": " Paris", "finished": False, "index": 0, "t": 0.0}])
    assert "全班能看到答案的前 <b>1</b> 个词元，即第 <b>5</b> 个位置之前的部分。" in cut.text, cut.text
    assert "请求已经结束；答案从第 <b>5</b> 个位置起先隐藏" in cut.text and not prose(cut.text), prose(cut.text)


def test_the_batching_stage_in_chinese_with_its_numbers():
    steps = [{"type": "schedule.step", "step": s, "batch": [{"request_id": "r1", "kind": k}]
              + ([{"request_id": "r2", "kind": "decode"}] if s > 1 else [])} for s, k in ((1, "prefill"), (2, "decode"),
                                                                                         (3, "decode"))]
    en, zh = stage("en", "batching", events() + steps), stage("zh_CN", "batching", events() + steps)
    assert "Of this request's <b>3</b> engine steps, <b>2</b> were shared with <b>1</b> other request" in en.text
    assert en.chip == "shared 2 of 3" and zh.chip == "3 步中 2 步共享"
    assert "在这个请求的 <b>3</b> 个引擎步中，有 <b>2</b> 步与 <b>1</b> 个其他请求共享批次" in zh.text, zh.text
    assert not prose(zh.text), prose(zh.text)
    alone = stage("zh_CN", "batching", events() + [dict(s, batch=s["batch"][:1]) for s in steps], hidden_from=5)
    assert "在它第 <b>5</b> 个位置之前的 <b>3</b> 个引擎步里，批次中没有其他请求" in alone.text, alone.text
    assert alone.chip == "单独运行" and not prose(alone.text), prose(alone.text)


def test_the_prefill_decode_stage_in_chinese_with_its_numbers():
    steps = [{"type": "schedule.step", "step": s, "batch": [{"request_id": "r1", "kind": k}], "forward_seconds": 0.002}
             for s, k in ((1, "prefill"), (2, "decode"), (3, "decode"))]
    fin = {"type": "finish", "step": 3, "reason": "stop", "ttft": 0.01, "usage": {}}
    en, zh = stage("en", "timeline", events() + steps + [fin]), stage("zh_CN", "timeline", events() + steps + [fin])
    assert ("Prefill ran the whole prompt (<b>4</b> tokens) through the model in <b>1</b> forward pass (long prompts "
            "are cut into chunks that share steps with other requests); then <b>2</b> decode steps produced the "
            "answer.") in en.text and en.chip == "TTFT 10.0 ms"
    assert "预填充让整个提示（<b>4</b> 个词元）用 <b>1</b> 次前向计算过了一遍模型" in zh.text, zh.text
    assert "之后<b>2</b> 个解码步生成了答案。" in zh.text and "首个词元用时：<b>10.0 ms</b>。一次前向计算" in zh.text
    assert zh.chip == "首词元 10.0 ms" and not prose(zh.text), prose(zh.text)


def test_the_prefix_cache_stage_in_chinese_with_its_numbers():
    hit = {"type": "prefix_cache.lookup", "step": 1, "prompt_tokens": 4, "cached_tokens": 2, "full_blocks": 1,
           "hit": True, "cached_blocks": [3]}
    en, zh = stage("en", "prefix", events() + [hit]), stage("zh_CN", "prefix", events() + [hit])
    assert "A <b>HIT</b>. The engine hashed the prompt in blocks of <b>2</b> tokens" in en.text and en.chip == "1 block hit"
    assert "<b>命中</b>。引擎把提示按每块 <b>2</b> 个词元算出哈希，发现其中 <b>1</b> 个块已经在缓存里" in zh.text, zh.text
    assert "只有其余 <b>2</b> 个词元需要现在计算。" in zh.text and zh.chip == "命中 1 个块" and not prose(zh.text)
    miss = stage("zh_CN", "prefix", events() + [dict(hit, hit=False, cached_tokens=0, cached_blocks=[])])
    assert "<b>未命中</b>。引擎为提示的 <b>1</b> 个整块（每块 <b>2</b> 个词元）算出哈希" in miss.text, miss.text
    assert "它会找到 <b>1</b> 个块（<b>2</b> 个词元；" in miss.text and miss.chip == "未命中", miss.text
    assert not prose(miss.text), prose(miss.text)


def test_the_kv_stage_in_chinese_with_its_numbers():
    fin = {"type": "finish", "step": 3, "reason": "stop", "usage": {}}
    en, zh = stage("en", "kv", events() + [fin]), stage("zh_CN", "kv", events() + [fin])
    assert "kept: 2 × 2 layers × 1 KV head × 4 dims × 4 bytes = <b>64</b> bytes per token." in en.text
    assert "At its end this request held K/V for <b>5</b> tokens: 320 B in <b>3</b> blocks of 2 tokens" in en.text
    assert "2 × 2 层 × 1 个 KV 头 × 4 维 × 4 字节 = 每个词元 <b>64</b> 字节。" in zh.text, zh.text
    assert "结束时，这个请求为 <b>5</b> 个词元保存了 K/V：320 B，放在 <b>3</b> 个块里（每块 2 个词元）" in zh.text, zh.text
    assert zh.chip == en.chip == "320 B" and not prose(zh.text), prose(zh.text)


def test_a_stage_not_reached_says_so_in_chinese():
    waiting = stage("zh_CN", "kv", events()[:1], [])
    assert "尚未到达：这个请求还在途中" in waiting.text and not waiting.reached and not prose(waiting.text)
    ended = stage("zh_CN", "sampling", events()[:1] + [{"type": "finish", "step": 1, "reason": "abort", "usage": {}}], [])
    assert "未到达：请求在引擎运行到这里之前就结束了（abort）。" in ended.text, ended.text
    assert "这个阶段就会显示请求在这里经历了什么" in next(
        s for s in journey(MODEL, "", None, [], [], lang="zh_CN") if s.key == "answer").text


def test_the_layers_stage_in_chinese_with_its_numbers():
    en, zh = stage("en", "layers"), stage("zh_CN", "layers")
    assert "The matrix now passes through <b>2</b> layers." in en.text and en.chip == "2 layers"
    assert "这个矩阵现在依次经过 <b>2</b> 层。" in zh.text and "使用<b>2</b> 个查询头，共用同一个键/值头" in zh.text, zh.text
    assert "2 层中有 <b>1</b> 层是局部的：一个词元只能看到最近的 <b>2</b> 个词元（滑动窗口；第 1 层）。" in zh.text
    assert "第 1 号专家接到的最多，占全部 <b>12</b> 次选择中的 <b>4</b> 次（33%）。" in zh.text, zh.text
    assert zh.chip == "2 层" and not prose(zh.text), prose(zh.text)
    dense = next(s for s in journey({**MODEL, "is_moe": False, "sliding_windows": [2, 2], "num_kv_heads": 2}, "r1",
                                    None, events(), [], lang="zh_CN") if s.key == "layers")
    assert "每一层都是局部的" in dense.text and "稠密的 SwiGLU MLP" in dense.text and not prose(dense.text), dense.text


def test_the_request_stage_in_chinese_with_its_numbers():
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 20, "temperature": 0.5}
    en = next(s for s in journey(MODEL, "r1", body, events(), [], lang="en") if s.key == "request")
    zh = next(s for s in journey(MODEL, "r1", body, events(), [], lang="zh_CN") if s.key == "request")
    assert ("A client sent a JSON body like any OpenAI client would: <b>1</b> message, <b>5</b> characters of text, "
            "asking for at most <b>20</b> new tokens at temperature <b>0.50</b>.") in en.text and en.chip == "5 chars"
    assert "<b>1</b> 条消息，共 <b>5</b> 个字符的文本，要求最多生成 <b>20</b> 个新词元，温度为 <b>0.50</b>。" in zh.text, zh.text
    assert "分配了 ID <b>r1</b>" in zh.text and zh.chip == "5 个字符" and not prose(zh.text), prose(zh.text)
