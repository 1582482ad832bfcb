"""visualizers/: pure functions from trace events (dicts) to HTML, tested without a server:
on hand-made events whose right answer is known, and on a real trace from a tiny engine."""
from __future__ import annotations

import base64
import io
import re

import numpy as np
import pytest

import visualizers as viz
from app.page.live_view import LiveView
from visualizers._html import png_data_uri

XSS = ["<img src=x onerror=alert(1)>", "</script><b>x", "\"'><svg onload=alert(2)>"]


# --- a real trace -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trace(checkpoint):
    """Events of one chat request with tensors captured, through speculative decoding."""
    from engine import LLM, SamplingParams, TraceEvent
    llm = LLM(checkpoint("mixtral"), draft=checkpoint("mistral"), num_speculative_tokens=3)
    events, outputs = [], []
    msgs = [{"role": "system", "content": XSS[1]}, {"role": "user", "content": XSS[0]}]
    for item in llm.stream(messages=msgs, params=SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=3,
                                                                 max_tokens=10), trace="full"):
        if isinstance(item, TraceEvent):
            events.append(item.to_dict())
        else:
            outputs.append(item)
    rid = events[0]["request_id"]
    return {"events": events, "rid": rid, "llm": llm,
            "by_type": {t: [e for e in events if e["type"] == t] for t in {e["type"] for e in events}}}


def _no_raw_markup(html: str) -> None:
    """Untrusted text shows escaped: none of the attack strings survives as markup."""
    for bad in ("<img src=x", "</script>", "<b>x", "<svg onload", "onerror=alert(1)>"):
        assert bad not in html, bad


def test_every_panel_draws_real_content_from_a_real_trace(trace):
    bt, rid = trace["by_type"], trace["rid"]
    tokens = [e for e in trace["events"] if e["type"] == "token"]
    htmls = {
        "tokens": viz.tokens_html(bt["tokenize"][0]),
        "prefix": viz.prefix_cache_html(bt["prefix_cache.lookup"][0], 16),
        "embedding": viz.embedding_html(bt["embed"]),
        "attention": viz.attention_html(bt["attention"], 1, 2),
        "moe": viz.moe_html(bt["moe"], 0),
        "sampling": viz.sampling_html(bt["sample"]),
        "spec": viz.spec_html(bt["spec"]),
        "answer": viz.answer_html(tokens, bt["finish"][0]),
        "timeline": viz.timeline_html(trace["events"], rid),
    }
    n_prompt = bt["tokenize"][0]["count"]
    assert htmls["tokens"].count('class="tt-chip') >= n_prompt
    assert f"<b>{n_prompt}</b>" in htmls["tokens"]
    assert "<img" in htmls["embedding"] and f"d_model {64}" in htmls["embedding"]
    assert "layer <b>1</b>" in htmls["attention"] and "query head <b>2</b>" in htmls["attention"]
    assert "KV head 1 ← query heads 2–3" in htmls["attention"]  # 4 query heads over 2 KV heads
    routed = len(viz.moe.moe_picks(bt["moe"], 0))
    assert htmls["moe"].count("tt-pick") == 2 * min(routed, viz.moe.MAX_ROWS)  # top-2 per token shown
    assert f"{routed} tokens routed" in htmls["moe"]
    assert "tt-drawn" in htmls["sampling"]
    assert f"rounds: <b>{len(bt['spec'])}</b>" in htmls["spec"]
    assert htmls["answer"].count("tt-timed") == len(tokens) == 10
    steps = viz.timeline_steps(trace["events"], rid)
    assert steps and steps[0]["kind"] == "prefill" and all(s["end"] >= s["start"] for s in steps)
    assert htmls["timeline"].count("<rect") >= len(steps)
    for html in htmls.values():
        _no_raw_markup(html)


def test_request_panel_escapes_and_reports_validation():
    body = {"messages": [{"role": "user", "content": XSS[0]}, {"role": "system", "content": XSS[1]}]}
    ok = viz.request_html(body, {"ok": True, "request_id": "<b>r</b>", "checks": [("messages", True, XSS[2])]})
    bad = viz.request_html(body, {"ok": False, "error": XSS[0], "checks": [("sampling", False, "top_p")]})
    for html in (ok, bad):
        _no_raw_markup(html)
    assert "valid" in ok and "&lt;b&gt;r&lt;/b&gt;" in ok
    assert "rejected" in bad and "&lt;img src=x onerror=alert(1)&gt;" in bad


def test_token_text_is_escaped_everywhere():
    toks = [{"id": i, "piece": p, "text": p, "special": i == 0} for i, p in enumerate(XSS)]
    tokenize = {"tokens": toks, "count": 3, "vocab_size": 100, "tokenizer_size": 99}
    html = viz.tokens_html(tokenize, [{"id": 5, "text": XSS[1], "special": False}])
    _no_raw_markup(html)
    assert html.count("tt-special") >= 2  # one chip + the legend
    pieces = {7: XSS[0], 8: XSS[1]}
    sample = {"position": 3, "candidates": [7, 8], "token_id": 8, "token_prob": 0.4, "entropy": 0.7,
              "params": {"temperature": 1.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0, "greedy": False},
              "stages": {"logits": {"probs": [0.6, 0.4], "kept": 2}, "top_k": {"probs": [1.0, 0.0], "kept": 1}}}
    html = viz.sampling_html([sample], pieces)
    _no_raw_markup(html)
    assert "tt-cut" in html  # the top-k cut is marked
    drafted = [dict(sample, source="draft"), dict(sample, source="corrected", position=4)]
    html = viz.sampling_html(drafted, pieces)
    assert "max(0, p − q)" in html and html.count("tt-chip-draft") == 1 and "token 2 of 2" in html
    assert "proposed by the draft model" in viz.sampling_html(drafted, pieces, step=0)
    spec = {"k": 2, "proposed": [7, 8], "proposed_text": XSS[:2], "draft_probs": [0.5, 0.5],
            "target_probs": [0.4, 0.1], "accepted": 1, "token": 9, "token_text": XSS[2], "token_kind": "corrected",
            "acceptance_rate": 0.5, "greedy": False}
    html = viz.spec_html([spec])
    _no_raw_markup(html)
    assert "tt-acc" in html and "tt-rej" in html and "tt-corrected" in html
    html = viz.answer_html([{"index": 0, "token_id": 1, "text": XSS[0], "t": 0.1, "latency": 0.1}],
                           {"text": XSS[0] + XSS[1], "reason": "stop", "usage": {}})
    _no_raw_markup(html)
    moe = {"layer": 0, "start": 0, "experts": [[0, 1]], "weights": [[0.7, 0.3]], "num_experts": 2, "top_k": 2,
           "batch_load": [1, 1]}
    _no_raw_markup(viz.moe_html([moe], 0, labels=[XSS[0]]))


def test_attention_matrix_places_prefill_and_decode_rows_with_causal_and_window_masks():
    prefill = {"layer": 0, "kind": "prefill", "heads": [0, 1], "q_start": 0, "k_start": 0, "window": 2,
               "num_heads": 2, "num_kv_heads": 1,
               "probs": [[[1, 0, 0], [0.5, 0.5, 0], [0, 0.25, 0.75]], [[1, 0, 0], [0, 1, 0], [0, 0, 1]]]}
    decode = {"layer": 0, "kind": "decode", "heads": [0, 1], "q_start": 3, "k_start": 0, "window": 2,
              "num_heads": 2, "num_kv_heads": 1, "probs": [[[0, 0, 0.1, 0.9]], [[0, 0, 0, 1]]]}
    probs, mask, kinds, lo, window = viz.attention_matrix([prefill, decode], 0, 0)
    assert probs.shape == (4, 4) and lo == 0 and window == 2
    assert kinds == ["prefill", "prefill", "prefill", "decode"]
    assert probs[2, 2] == 0.75 and probs[3, 3] == 0.9
    assert mask[0, 1] == 1 and mask[3, 3] == 0  # causal: no key after the query
    assert mask[2, 0] == 2 and mask[3, 1] == 2 and mask[3, 2] == 0  # window 2: keys q-1, q only
    html = viz.attention_html([prefill, decode], 0, 1, labels=list("abcd"))
    assert "sliding window 2" in html and "1 decode" in html
    assert "KV head 0 ← query heads 0–1" in html


def test_embedding_rows_are_ordered_by_position_with_their_shape():
    a = {"start": 0, "token_ids": [5, 6], "shape": [2, 128], "dims": 3, "rows": [[0, 1, 2], [3, 4, 5]]}
    b = {"start": 2, "token_ids": [7], "shape": [1, 128], "dims": 3, "rows": [[6, 7, 8]]}
    mat, ids = viz.embedding_matrix([b, a])
    assert ids == [5, 6, 7] and mat[:, 0].tolist() == [0, 3, 6]
    html = viz.embedding_html([a, b])
    assert "[3 tokens × d_model 128]" in html and "first 3 of 128" in html


def test_png_encoder_round_trips():
    from PIL import Image
    rgb = (np.arange(4 * 5 * 3).reshape(4, 5, 3) * 3).astype(np.uint8)
    img = Image.open(io.BytesIO(base64.b64decode(png_data_uri(rgb).split(",", 1)[1])))
    assert img.size == (5, 4) and np.array_equal(np.asarray(img.convert("RGB")), rgb)


def test_kv_grid_marks_each_block_state():
    snap = {"step": 7, "num_blocks": 8, "block_size": 4, "ref": [1, 2, 1, 0, 0, 1, 0, 0],
            "cached": [True, True, False, True, False, False, True, False],
            "owners": {"0": ["me"], "1": ["me", "<b>other</b>"], "2": ["me"], "5": ["<b>other</b>"]},
            "fill": {"0": 4, "1": 4, "2": 1, "5": 3}}
    events = [{"type": "kv.share", "blocks": [1]}, {"type": "kv.alloc", "blocks": [0, 2], "table": [1, 0, 2]},
              {"type": "kv.free", "blocks": [6]}]
    model = {"num_layers": 3, "num_kv_heads": 2, "head_dim": 16, "dtype": "float32", "dtype_bytes": 4,
             "num_blocks": 8, "block_size": 4, "kv_cache_bytes": 8 * 4 * 768}
    html = viz.kv_grid_html(snap, "me", events, model)
    assert viz.kv_cache.block_states(snap, "me", events) == [
        "mine", "shared", "mine", "cached", "free", "other", "cached", "free"]  # 6: freed, kept by the prefix cache
    assert 'data-mine="2" data-shared="1" data-other="1" data-cached="2" data-freed="0" data-free="2"' in html
    img, cols = viz.kv_cache.grid_image(viz.kv_cache.block_states(snap, "me", events), {2: 1, 5: 4}, 4)
    cell = img[:12, 2 * 14:2 * 14 + 12]  # block 2: 1 of 4 slots written -> the bottom quarter is filled
    assert (cell[-3:] == viz.kv_cache.STATE_RGB["mine"][1]).all() and (cell[:9] == viz.kv_cache.STATE_RGB["mine"][0]).all()
    assert "&lt;b&gt;other&lt;/b&gt;: 2 blocks" in html
    assert "2 × 3 × 2 × 16 × tokens × 4 B" in html and "768 B per token" in html
    assert "768 B × 9 tokens" in html  # this request's blocks hold 4 + 4 + 1 tokens
    # After the end its blocks are gone from the pool; the formula quotes what it held then.
    gone = dict(snap, owners={"5": ["<b>other</b>"]}, ref=[0, 0, 0, 0, 0, 1, 0, 0])
    done = viz.kv_grid_html(gone, "me", events + [{"type": "kv.free", "blocks": [0, 1, 2]}], model, final_tokens=9)
    assert "this request, when it finished: 768 B × 9 tokens" in done and "× 0 tokens" not in done
    _no_raw_markup(html.replace("&lt;b&gt;", ""))
    assert "<b>other</b>" not in html


def test_kv_pool_events_fold_into_the_pool_drawn():
    full = {"type": "kv.pool", "step": 3, "num_blocks": 6, "block_size": 4, "full": True, "blocks": [0, 1, 4],
            "owners": [["a"], ["a", "b"], []], "ref": [1, 2, 0], "fill": [4, 2, 0], "cached": [True, False, True],
            "request_ids": ["a"]}
    pool = viz.apply_kv_pool(None, full)
    assert pool == {"step": 3, "num_blocks": 6, "block_size": 4, "ref": [1, 2, 0, 0, 0, 0],
                    "cached": [True, False, False, False, True, False], "owners": {0: ["a"], 1: ["a", "b"]},
                    "fill": {0: 4, 1: 2}}
    delta = {**full, "step": 5, "full": False, "blocks": [1, 2], "owners": [[], ["b"]], "ref": [0, 1],
             "fill": [0, 1], "cached": [False, False]}
    assert viz.apply_kv_pool(pool, delta) is pool  # in place
    assert pool["owners"] == {0: ["a"], 2: ["b"]} and pool["fill"] == {0: 4, 2: 1} and pool["ref"][:3] == [1, 0, 1]
    assert pool["step"] == 5 and pool["cached"][4]  # untouched blocks keep their state
    again = viz.apply_kv_pool(pool, {**full, "step": 9, "blocks": [3], "owners": [["c"]], "ref": [1], "fill": [3],
                                     "cached": [False]})
    assert again["owners"] == {3: ["c"]} and sum(again["ref"]) == 1 and not any(again["cached"])  # full: afresh
    assert viz.pool_at([full, delta], 4)["owners"] == {0: ["a"], 1: ["a", "b"]} and viz.pool_at([delta], 2) is None
    copy = viz.copy_pool(pool)
    copy["ref"][0] = 7
    assert pool["ref"][0] == 1


def test_the_kv_panel_draws_the_pool_of_the_decode_engine_the_request_decoded_on():
    """--disaggregate --decode-ranks 2: each decode engine has its own pool (kv.pool: decode 0's,
    kv.decode_pool: the others', with engine_index); a request decoded on decode 1 is drawn on
    decode 1's pool with its blocks there, not on decode 0's grid with decode 1's block ids."""
    def pool(kind, j, blocks, owner, fill):
        return {"type": kind, "request_id": None, "step": 4, "num_blocks": 8, "block_size": 4, "full": True,
                "blocks": blocks, "owners": [[owner]] * len(blocks), "ref": [1] * len(blocks), "fill": fill,
                "cached": [False] * len(blocks), "request_ids": [owner], "engine": "decode", "engine_index": j}
    evs = [{"type": "kv.alloc", "request_id": "r1", "step": 1, "blocks": [0, 1, 2], "table": [0, 1, 2],
            "engine": "prefill", "engine_index": 0},
           {"type": "kv.transfer", "request_id": "r1", "step": 2, "src": "prefill 0", "dst": "decode 1",
            "engine": "decode"},
           {"type": "kv.alloc", "request_id": "r1", "step": 2, "blocks": [4, 5, 6], "table": [4, 5, 6],
            "engine": "decode", "engine_index": 1},
           pool("kv.pool", 0, [0, 1], "x", [4, 4]), pool("kv.decode_pool", 1, [4, 5, 6], "r1", [4, 4, 2])]
    assert viz.decode_engine_of(evs) == 1 and viz.decode_engine_of(evs[:1]) == 0
    assert [e["table"] for e in viz.engine_kv_events(evs, 1) if e["type"] == "kv.alloc"] == [[4, 5, 6]]
    model = {"name": "m", "num_layers": 2, "num_kv_heads": 1, "head_dim": 4, "dtype": "float32", "dtype_bytes": 4,
             "num_blocks": 8, "block_size": 4, "kv_cache_bytes": 1024}
    v = LiveView(model=model, piece=str, is_special=lambda i: False)
    v.request_id = "r1"
    v.add(evs)
    html = v.render("kv")
    assert 'data-mine="3"' in html and "block table: 4, 5, 6" in html and "holds 10 tokens in 3 blocks" in html
    assert "other requests: none" in html  # decode 0's request x is in another pool
    one = LiveView(model=model, piece=str, is_special=lambda i: False)  # one engine: kv.pool is the pool
    one.request_id = "x"
    one.add([{k: v for k, v in evs[-2].items() if k not in ("engine", "engine_index")}])
    assert 'data-mine="2"' in one.render("kv")


def test_a_stream_trace_draws_the_kv_pool(trace):
    """LLM.stream's events alone (no server) draw the KV panel: its kv.pool events."""
    events, rid = trace["events"], trace["rid"]
    pools = [e for e in events if e["type"] == "kv.pool"]
    assert pools and pools[0]["full"] and all(rid in e["request_ids"] for e in pools)
    kv = [e for e in events if e["type"].startswith("kv.")]
    fin = trace["by_type"]["finish"][0]
    model = {"num_layers": 4, "num_kv_heads": 2, "head_dim": 16, "dtype": "float32", "dtype_bytes": 4,
             "num_blocks": pools[0]["num_blocks"], "block_size": pools[0]["block_size"], "kv_cache_bytes": 1}
    during = viz.kv_grid_html(viz.pool_at(events, fin["step"] - 1), rid, kv, model)
    held = int(re.search(r"this request holds ([\d,]+) tokens", during)[1].replace(",", ""))
    assert 0 < held < fin["usage"]["prompt_tokens"] + fin["usage"]["completion_tokens"]
    after = viz.pool_at(events)
    assert after["owners"] == {} and after["step"] == fin["step"]
    assert 'data-mine="0"' in viz.kv_grid_html(after, rid, kv, model) and "data-freed" in during


def test_kv_calculator_uses_published_configs():
    m = viz.REFERENCE_MODELS
    assert viz.kv_cache_bytes(m["Llama-3-8B"], 2000, "float16") == 262_144_000  # ≈ 250 MiB
    assert viz.kv_cache_bytes(m["Llama-3-70B"], 1, "bfloat16") == 2 * 80 * 8 * 128 * 2
    assert viz.kv_cache_bytes(m["Mixtral-8x7B"], 10, "float32") == 2 * 32 * 8 * 128 * 10 * 4
    assert viz.kv_cache_bytes(m["DeepSeek-V3"], 1000, "fp8") == 61 * 576 * 1000  # one latent per layer
    html = viz.calculator_html(2000, "float16")
    assert "262,144,000 B" in html and "DeepSeek-V3" in html and "without the latent" in html
    with pytest.raises(ValueError):
        viz.calculator_html(10, "float13")


def test_empty_inputs_draw_placeholders_not_errors():
    for html in (viz.tokens_html(None), viz.prefix_cache_html(None), viz.embedding_html([]),
                 viz.attention_html([]), viz.kv_grid_html(None, None), viz.moe_html([], is_moe=False),
                 viz.sampling_html([]), viz.spec_html([], enabled=False), viz.answer_html([]),
                 viz.timeline_html([], "r")):
        assert "tt-empty" in html or "tt-answer" in html


def test_visualizers_import_nothing_from_engine_or_app():
    import pathlib
    for f in pathlib.Path(viz.__file__).parent.glob("*.py"):
        src = f.read_text()
        assert not re.search(r"^\s*(from|import)\s+(engine|app)\b", src, re.M), f


def test_timeline_names_the_requests_that_shared_each_batch():
    ev = [{"type": "request.arrive", "ts": 1.0}, {"type": "tokenize", "ts": 1.0, "seconds": 0.01},
          {"type": "schedule.step", "step": 1, "ts": 1.2, "forward_seconds": 0.1, "num_tokens": 9,
           "batch": [{"request_id": "a", "kind": "prefill", "num_tokens": 8}]},
          {"type": "schedule.step", "step": 2, "ts": 1.3, "forward_seconds": 0.05, "num_tokens": 5,
           "batch": [{"request_id": "a", "kind": "decode", "num_tokens": 1},
                     {"request_id": "<i>b</i>", "kind": "prefill", "num_tokens": 4}]},
          {"type": "token", "ts": 1.21, "index": 0, "t": 0.21}]
    steps = viz.timeline_steps(ev, "a")
    assert [s["kind"] for s in steps] == ["prefill", "decode"] and steps[1]["others"] == ["<i>b</i>"]
    assert abs(steps[0]["start"] - 1.1) < 1e-9
    html = viz.timeline_html(ev, "a")
    assert "1 step shared with other requests (&lt;i&gt;b&lt;/i&gt;: 1)" in html and "<i>b</i>" not in html
    assert "TTFT 210.0 ms" in html


def test_the_timeline_table_counts_the_requests_own_steps_as_the_replay_does():
    """A replay says "step 24 of 48 engine steps"; the table's step column said the engine's
    global number (146): the request's own count first, the engine's number beside it."""
    ev = [{"type": "request.arrive", "ts": 0.5}] + [
        {"type": "schedule.step", "step": 140 + i, "ts": 1.0 + i, "forward_seconds": 0.1, "num_tokens": 1,
         "batch": [{"request_id": "a", "kind": "prefill" if i == 0 else "decode", "num_tokens": 1}]} for i in range(3)]
    html = viz.timeline_html(ev, "a")
    rows = re.findall(r"<tr><td>(\d+) <small[^>]*>#(\d+)</small>", html)
    assert rows == [("3", "142"), ("2", "141"), ("1", "140")], rows


def test_what_is_redrawn_while_streaming_does_not_grow_with_the_answer():
    """Issue 13, item 12: the answer is redrawn ten times a second and the timeline and tokens
    once a second or so; if their HTML grew with the answer, a 512-token answer would send the
    browser megabytes and fall seconds behind. Past a bound, only the text grows."""
    def tokens(n):
        return [{"index": i, "token_id": 7, "text": " w", "t": 0.1 + i * 0.01, "latency": 0.01, "ts": 1.1 + i * 0.01}
                for i in range(n)]

    def events(n):
        ev = [{"type": "request.arrive", "ts": 1.0}, {"type": "tokenize", "ts": 1.0, "seconds": 0.001}]
        ev += [{"type": "schedule.step", "step": i + 1, "ts": 1.1 + i * 0.01, "forward_seconds": 0.005, "num_tokens": 1,
                "batch": [{"request_id": "r", "kind": "decode" if i else "prefill", "num_tokens": 1}]}
               for i in range(n)]
        return ev + [dict(t, type="token") for t in tokens(n)]

    def grown(draw, small=300, big=600, text_bytes=0):
        return len(draw(big)) - len(draw(small)) - (big - small) * text_bytes

    assert grown(lambda n: viz.answer_html(tokens(n)), text_bytes=len(" w")) < 200
    assert grown(lambda n: viz.timeline_html(events(n), "r")) < 300 * 40  # a path, not a node per step
    gen = [{"id": 7, "text": " w", "special": False}]
    tok = {"tokens": [{"id": 1, "piece": "a", "text": "a"}], "count": 1, "vocab_size": 10}
    assert grown(lambda n: viz.tokens_html(tok, gen * n)) < 200
    assert "the newest 64 of 512 tokens" in viz.answer_html(tokens(512))


def test_numbers_never_show_a_negative_zero():
    from visualizers._html import fixed, fmt_ms
    assert fmt_ms(-0.00001) == "0.0 ms" and fmt_ms(0.0123) == "12.3 ms"
    assert fixed(-0.0001, 3) == "0.000" and fixed(-0.5, 2) == "-0.50"
    html = viz.embedding_html([{"start": 0, "rows": [[-0.0001, 0.0]], "token_ids": [5], "shape": [1, 2]}])
    assert "-0.000" not in html


def test_the_timeline_quotes_the_engines_queue_time_once():
    ev = [{"type": "request.arrive", "ts": 1.0}, {"type": "tokenize", "ts": 1.0, "seconds": 0.001},
          {"type": "prefix_cache.lookup", "ts": 1.0091},
          {"type": "schedule.step", "step": 1, "ts": 1.04, "forward_seconds": 0.02, "num_tokens": 8,
           "batch": [{"request_id": "a", "kind": "prefill", "num_tokens": 8}]},
          {"type": "token", "ts": 1.041, "index": 0, "t": 0.042}]
    live = viz.timeline_html(ev, "a")  # before the finish: admission is the prefix-cache lookup
    head = re.search(r"<div class='tt-lines'><div>(.*?)</div>", live).group(1)
    assert re.findall(r"queue[^·]*?([\d.]+) ms", head) == ["9.1"]
    fin = {"type": "finish", "ts": 1.05, "ttft": 0.042,
           "ttft_split": {"tokenize": 0.001, "queue": 0.009, "prefill": 0.031, "first_sample": 0.001}}
    done = viz.timeline_html(ev + [fin], "a")
    head = re.search(r"<div class='tt-lines'><div>(.*?)</div>", done).group(1)
    assert re.findall(r"queue[^+]*?([\d.]+) ms", head) == ["9.0"]  # the engine's figure, once
    assert "queue (arrival to admission by the scheduler): 9.0 ms" in done  # the bar says the same


def test_the_kv_formula_names_the_pools_dtype_not_the_weights():
    """bfloat16 weights on the CPU keep a float32 pool: the formula said "4 B (bfloat16)"."""
    from visualizers.kv_cache import kv_formula_html
    model = {"num_layers": 2, "num_kv_heads": 1, "head_dim": 4, "dtype": "bfloat16", "kv_dtype": "float32",
             "dtype_bytes": 4, "num_blocks": 2, "block_size": 4, "kv_cache_bytes": 512}
    html = kv_formula_html(model, 3)
    assert "4 B (float32)" in html and "bfloat16" not in html
    assert "4 B (bfloat16)" in kv_formula_html({**model, "kv_dtype": None}, 3)  # an older trace file: as before
