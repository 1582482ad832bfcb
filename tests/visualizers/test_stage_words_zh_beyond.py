"""Issue 42: the Speculation and Beyond one device stages speak Chinese from the catalogs with
this request's numbers (rounds, shares, heads, bytes), and English as they did."""
from __future__ import annotations

from tests.trace_views import MODEL
from tests.visualizers.test_stage_words_zh import prose, stage
from visualizers.disagg import disagg_stage_html
from visualizers.journey import journey
from visualizers.parallel import measured_stage_html
from visualizers.stages.beyond import how_to_split
from visualizers.stages.speculation import without

DRAFTED = {**MODEL, "has_draft": True}
ROUNDS = [{"type": "spec", "step": 2, "k": 4, "accepted": 3, "position": 5, "method": "draft"},
          {"type": "spec", "step": 3, "k": 4, "accepted": 1, "position": 9, "method": "draft"}]
NGRAM = {"type": "spec", "step": 2, "k": 3, "accepted": 2, "position": 5, "method": "ngram",
         "lookup": {"max_n": 3, "min_n": 1}, "ngram": {"n": 2, "text": ["a", "b"], "start": 1},
         "copied_from": [3, 5], "proposed_text": ["c", "<d>"], "prompt_tokens": 4}


def spec_stage(lang: str, evs: list[dict], model: dict = DRAFTED):
    return next(s for s in journey(model, "r1", {"messages": []}, evs, [], lang=lang) if s.key == "spec")


def test_a_drafted_request_in_chinese_with_its_rounds_and_share():
    en, zh = spec_stage("en", ROUNDS), spec_stage("zh_CN", ROUNDS)
    assert "Over <b>2</b> rounds it proposed <b>8</b> and the target kept <b>4</b> (50%)" in en.text, en.text
    assert "3.00 tokens per target pass instead of 1." in en.text and en.chip == "50% kept"
    assert "<b>2</b> 轮下来，草稿共提出 <b>8</b> 个，目标模型接受了 <b>4</b> 个（50%）" in zh.text, zh.text
    assert "目标模型每算一遍得到 3.00 个词元" in zh.text and zh.chip == "接受 50%"
    assert not prose(zh.text), prose(zh.text)


def test_ngram_lookup_in_chinese_quotes_its_example_escaped():
    zh = spec_stage("zh_CN", [NGRAM])
    assert "<b>n-gram 查找</b>" in zh.text and "n 从 <b>3</b> 减到 <b>1</b>" in zh.text, zh.text
    assert "有 <b>1</b> 轮找到了匹配，共提出 <b>3</b> 个词元" in zh.text, zh.text
    assert "之前在提示中的第 1–2 个词元出现过，于是引擎从提示 + 回答中的第 3–5 个词元复制了 «c&lt;d&gt;»" in zh.text, zh.text
    assert "<d>" not in zh.text


def test_why_a_request_cannot_speculate_in_chinese():
    zh = spec_stage("zh_CN", [], MODEL)
    assert zh.skipped and zh.chip == "关闭" and "这个模型启动时没有草稿" in zh.text, zh.text
    assert without(MODEL, {}).startswith("this model is served without a draft")
    assert "每步只解码一个词元" in without(DRAFTED, {"min_tokens": 3}, "zh_CN")


def test_beyond_one_device_in_chinese_with_the_models_numbers():
    model = {**MODEL, "num_heads": 9, "num_kv_heads": 3, "num_layers": 30, "hidden_size": 576, "dtype_bytes": 2,
             "is_moe": False}
    en, zh = how_to_split(model), how_to_split(model, lang="zh_CN")
    assert "N = 3 for this model" in en and "2 × 30 layers × 576 values × 2 B = <b>67.5 KiB</b>" in en, en
    assert "N = 2 does not work: 3 KV heads do not split in two." in en
    assert "每个 KV 头带的 3 个查询头必须和这个 KV 头放在同一个设备上" in zh, zh
    assert "每个词元 2 × 30 层 × 576 个数 × 2 B = <b>67.5 KiB</b>，与 N 无关" in zh and "N = 2 不行" in zh, zh
    moe = how_to_split({**model, "is_moe": True, "num_experts": 8, "top_k": 2, "split_sizes": [3]}, lang="zh_CN")
    assert "<b>专家并行 × 2</b>：每个设备放 8 个专家中的 4 个" in moe and "--tensor-parallel-size 3" in moe, moe
    st = stage("zh_CN", "parallel")
    assert st.skipped and "流水线并行" in st.text and set(prose(st.text)) <= {"all", "reduce"}, prose(st.text)


def test_a_sharded_and_a_disaggregated_request_in_chinese_with_their_numbers():
    ev = {"placement": {"ranks": [{"heads": [0, 1], "kv_heads": [0]}, {"heads": [2, 3], "kv_heads": [1]}]},
          "forward_seconds": 0.012, "collectives": [{"layer": 0, "bytes": 1024, "ms": [1.5, 2.0]}]}
    sharded = measured_stage_html([ev, ev], "zh_CN")
    assert "这个请求<b>分片运行</b>在 <b>2</b> 个秩上（秩 0：查询头 0–1，KV 头 0；秩 1：查询头 2–3，KV 头 1）" in sharded
    assert "all-reduce 占了 秩 0 3.0 ms（12%）、秩 1 4.0 ms（17%）" in sharded, sharded
    x = {"num_blocks": 3, "tokens": 40, "bytes": 123456, "layers": [0, 1], "backend": "shm", "wire_ms": 0.123,
         "queue_ms": 1.25, "prefill_ms": 12.5, "src": "prefill 0", "dst": "decode 1"}
    apart = disagg_stage_html(x, 0.05, "zh_CN")
    assert "<b>预填充与解码分离</b>：" in apart and "第 0 个预填充引擎用 12.5 ms 算完它的 40 个提示词元" in apart, apart
    assert "传到第 1 个解码引擎：交接共 1.4 ms，占它到首个词元的 50.0 ms 的 3%" in apart, apart
    assert "Prefill and decode apart</b>: this request was prefilled" in disagg_stage_html(x, 0.05)
