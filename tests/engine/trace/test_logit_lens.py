"""The logit lens (engine/trace/logit_lens.py): at capture level `full` every generated token gets
a `logit_lens` event whose rows equal Hugging Face's hidden states (output_hidden_states)
put through the final norm and LM head, whose last row is the model's own output (the
sampler's distribution), in plain decode and in speculative verify steps alike; and on the
real SmolLM2 " Paris" rises through the layers."""
from __future__ import annotations

import json

import pytest
import torch

from engine import CaptureConfig, EventList, SamplingParams, Tracer
from engine.llm_engine import LLMEngine
from tests.engine_utils import DEVICE
from tests.real_models import cached_gguf
from tests.tiny import load_reference
from visualizers.compact import lens_layers

PROMPT = torch.randint(4, 300, (9,), generator=torch.Generator().manual_seed(5)).tolist()
TOP = 4


def run(path, prompt, max_tokens=6, top=TOP, **kw):
    sink = EventList()
    engine = LLMEngine(path, device=DEVICE, tracer=Tracer(sink), trace_level="full",
                       capture=CaptureConfig(logit_lens_top=top), **kw)
    rid = engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    return engine, rid, sink


def by_position(sink: EventList, rid: str) -> list[dict]:
    """A request's lens events by position: a running request's newest token's lens comes at
    once, those before it after its last token (engine/trace/lens_queue.py)."""
    return sorted((e.data for e in sink.of(rid, "logit_lens")), key=lambda d: d["position"])


def hf_lens(path, tokens: list[int]) -> torch.Tensor:
    """[L + 1, positions, vocab]: HF's hidden states after the embedding and each layer, through
    the final norm and LM head; the last row is HF's own logits."""
    ref = load_reference(path)
    with torch.no_grad():
        out = ref(torch.tensor([tokens]), output_hidden_states=True)
        L = ref.config.num_hidden_layers
        assert len(out.hidden_states) == L + 1
        inner = ref.model
        rows = [ref.lm_head(inner.norm(h[0])) for h in out.hidden_states[:L]] + [out.logits[0]]
        logits = torch.stack(rows).float()
        if cap := getattr(ref.config, "final_logit_softcapping", None):  # HF caps its own logits already
            logits[:L] = torch.tanh(logits[:L] / cap) * cap
    return torch.softmax(logits, dim=-1)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_every_row_equals_transformers_hidden_states_through_norm_and_head(checkpoint, arch):
    engine, rid, sink = run(checkpoint(arch), PROMPT)
    tokens = PROMPT + engine.get_output(rid).token_ids
    lens = by_position(sink, rid)
    samples = {e.data["position"]: e.data for e in sink.of(rid, "sample")}
    L = engine.model_config.num_layers
    assert [e["position"] for e in lens] == list(range(len(PROMPT), len(tokens)))  # one per generated token
    want = hf_lens(checkpoint(arch), tokens)
    for e in lens:
        pos, chosen = e["position"], e["token_id"]
        assert chosen == tokens[pos] and len(lens_layers(e)) == L + 1
        ref = want[:, pos - 1]  # the distribution at a position is read from the token before it
        for row, r in zip(lens_layers(e), ref):
            assert len(row["top_ids"]) == len(row["top_probs"]) == len(row["top_texts"]) == TOP
            torch.testing.assert_close(torch.tensor(row["top_probs"], dtype=torch.float64),
                                       r[row["top_ids"]].double(), atol=2e-4, rtol=0)
            assert row["top_probs"][0] == pytest.approx(r.max().item(), abs=2e-4)
            assert row["chosen_prob"] == pytest.approx(r[chosen].item(), abs=2e-4)
            c = r[chosen]  # the rank, up to ties within float noise (relative: most probabilities are tiny)
            assert 1 + int((r > c * 1.001).sum()) <= row["chosen_rank"] <= int((r >= c * 0.999).sum())
            assert row["top_texts"] == [engine.tokenizer.token_label(t) for t in row["top_ids"]]
        # the last row is the model's own output: greedy picked its top token, as the sampler saw it
        last, s = lens_layers(e)[-1], samples[pos]
        assert last["top_ids"][0] == chosen and last["chosen_rank"] == 1
        assert last["chosen_prob"] == pytest.approx(s["token_prob"], abs=1e-4)
        probs = dict(zip(s["candidates"], s["stages"]["logits"]["probs"]))
        for t, p in zip(last["top_ids"], last["top_probs"]):
            assert p == pytest.approx(probs[t], abs=1e-4)
    json.dumps(lens)  # plain JSON values


def test_speculative_verify_rows_map_to_their_tokens(checkpoint):
    """n-gram speculation: several tokens from one verify pass, each with the lens of its own row."""
    path = checkpoint("llama")
    prompt = PROMPT * 3  # repeats, so prompt lookup proposes
    engine, rid, sink = run(path, prompt, max_tokens=10, draft="ngram")
    assert sink.of(rid, "spec"), "no speculative round ran"
    tokens = prompt + engine.get_output(rid).token_ids
    lens = by_position(sink, rid)
    assert [e["position"] for e in lens] == list(range(len(prompt), len(tokens)))
    want = hf_lens(path, tokens)
    for e in lens:
        for row, r in zip(lens_layers(e), want[:, e["position"] - 1]):
            assert row["chosen_prob"] == pytest.approx(r[e["token_id"]].item(), abs=2e-4)


def test_a_lens_beside_a_request_without_one_reads_its_own_rows(checkpoint):
    """The lens's rows share the LM head's matmul with every sampled row of the batch: a
    request whose sampled row is not the first still gets its own rows, the same as alone."""
    path = checkpoint("llama")
    _, rid, sink = run(path, PROMPT)
    alone = by_position(sink, rid)
    sink = EventList()
    engine = LLMEngine(path, device=DEVICE, tracer=Tracer(sink), trace_level="full",
                       capture=CaptureConfig(logit_lens_top=TOP))
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    other = engine.add_request(PROMPT[::-1], params, trace_level="basic")
    rid = engine.add_request(PROMPT, params)
    while engine.has_unfinished_requests():
        engine.step()
    together = by_position(sink, rid)
    assert not sink.of(other, "logit_lens") and len(together) == len(alone) == 6
    for a, b in zip(alone, together):
        assert a["position"] == b["position"] and a["token_id"] == b["token_id"]
        for ra, rb in zip(lens_layers(a), lens_layers(b)):
            assert ra["top_ids"] == rb["top_ids"] and ra["chosen_rank"] == rb["chosen_rank"]
            assert ra["top_probs"] == pytest.approx(rb["top_probs"], abs=2e-4)


def test_no_lens_below_full_or_when_turned_off(checkpoint):
    _, rid, sink = run(checkpoint("llama"), PROMPT, max_tokens=2, top=0)
    assert sink.of(rid, "sample") and not sink.of(rid, "logit_lens")
    sink = EventList()
    engine = LLMEngine(checkpoint("llama"), device=DEVICE, tracer=Tracer(sink), trace_level="basic")
    rid = engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()
    assert sink.of(rid, "sample") and not sink.of(rid, "logit_lens")


@pytest.mark.slow  # a real model
def test_paris_rises_through_smollm2s_layers():
    path = cached_gguf("smollm2")
    sink = EventList()
    engine = LLMEngine(path, device=DEVICE, tracer=Tracer(sink), trace_level="full",
                       capture=CaptureConfig(logit_lens_top=5))
    ids = engine.tokenizer.encode("The capital of France is", add_special_tokens=False)
    rid = engine.add_request(ids, SamplingParams(temperature=0, max_tokens=1))
    while engine.has_unfinished_requests():
        engine.step()
    e = sink.of(rid, "logit_lens")[0].data
    assert e["token_text"] == " Paris"
    rows = lens_layers(e)
    assert len(rows) == engine.model_config.num_layers + 1
    ranks, probs = [r["chosen_rank"] for r in rows], [r["chosen_prob"] for r in rows]
    assert ranks[-1] == 1 and rows[-1]["top_texts"][0] == " Paris" and probs[-1] > 0.5
    L = len(rows) - 1
    # measured on this model: rank ~1,500-5,000 through layer 23 (the lens reads punctuation and
    # spaces there), then 396, 92, 113, 34, 7, 3 and 1: " Paris" rises in the last layers only
    assert min(ranks[: L // 2]) > 1000  # the first half: no sign of the answer
    rises = next(i for i, r in enumerate(ranks) if r <= 100)
    assert rises >= 2 * L // 3  # the answer comes into view in the last third
    assert ranks[-2] <= 10 and all(r <= 200 for r in ranks[rises:])  # and stays in view


# --- the panel and the classroom stage -------------------------------------------------------

def test_the_panel_draws_every_row_escapes_token_text_and_marks_the_chosen_token(checkpoint):
    import html as markup
    import re

    from visualizers._html import prob

    from visualizers.logit_lens import logit_lens_html
    engine, rid, sink = run(checkpoint("llama"), PROMPT, max_tokens=3)
    events = sorted((e.to_dict() for e in sink.of(rid, "logit_lens")), key=lambda d: d["position"])
    hostile = {**events[-1], "token_text": "<b>&"}
    hostile["layers"] = [{**r, "top_texts": ["<script>x</script>"] + r["top_texts"][1:]} for r in lens_layers(events[-1])]
    html = logit_lens_html(events[:-1] + [hostile])
    assert "<script>" not in html and "<b>&" not in html and "&lt;script&gt;" in html
    L = engine.model_config.num_layers
    assert html.count("class=\"tt-lens-row") == L + 1 and "embedding" in html and f"layer {L - 1}" in html
    assert f"token {len(events)} of {len(events)}" in html  # the newest by default
    # the chosen token is outlined wherever it is among the candidates, and its rank shown on every row
    chosen = sum(r["top_ids"].count(hostile["token_id"]) for r in hostile["layers"])
    assert html.count("tt-lens-chosen") == chosen and chosen >= 1
    assert [int(x) for x in re.findall(r">#([\d,]+)</span> · ", html)] == [r["chosen_rank"] for r in hostile["layers"]]
    # hover: the exact probability and what the row and column are
    r0 = lens_layers(events[0])[0]
    first = logit_lens_html(events, position=events[0]["position"])
    assert f"token 1 of {len(events)}" in first
    assert markup.escape(f"embedding · candidate #1: {r0['top_texts'][0]!r}") in first  # escaped: a <0xBC> too
    assert f"p={prob(r0['top_probs'][0])}" in first  # the page's one format for a probability


def test_the_classroom_stage_sits_between_the_layers_and_sampling_and_quotes_the_lens(checkpoint):
    from visualizers.journey import journey
    engine, rid, sink = run(checkpoint("llama"), PROMPT, max_tokens=4)
    cfg = engine.model_config
    model = {"num_layers": cfg.num_layers, "num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads,
             "head_dim": cfg.head_dim, "hidden_size": cfg.hidden_size, "dtype_bytes": 4, "vocab_size": cfg.vocab_size,
             "dtype": "float32", "block_size": 16, "num_blocks": 64, "is_moe": False}
    events = [e.to_dict() for e in sink.events]
    st = journey(model, rid, None, events, [])
    keys = [s.key for s in st]
    assert keys.index("layers") < keys.index("logit_lens") < keys.index("sampling")
    lens = st[keys.index("logit_lens")]
    assert lens.title == f"{keys.index('logit_lens') + 1} · LM head and logit lens" and lens.panels == ("logit_lens",)
    newest = [e for e in events if e["type"] == "logit_lens"][-1]  # the panel's default: the newest pass
    from visualizers._html import show_piece
    assert f"predicted «{show_piece(newest['token_text'])}»" in lens.text
    assert f"ranked it <b>{lens_layers(newest)[0]['chosen_rank']:,}</b>" in lens.text
    assert f"Over the <b>{len(sink.of(rid, 'logit_lens'))}</b> traced tokens" in lens.text
    first = next(e for e in events if e["type"] == "logit_lens")  # a selected token: the pass that read it
    picked = journey(model, rid, None, events, [], position=first["position"] - 1)[keys.index("logit_lens")]
    assert f"ranked it <b>{lens_layers(first)[0]['chosen_rank']:,}</b>" in picked.text
    assert f"(position {first['position'] - 1:,}) and predicted" in picked.text
    outputs = [{"type": "output", "token_id": e["token_id"]} for e in events if e["type"] == "token"]  # as the page has
    basic = journey(model, rid, None, [e for e in events if e["type"] != "logit_lens"], outputs)
    assert "capture level full records one" in basic[keys.index("logit_lens")].text


def test_a_replay_shows_the_newest_token_of_each_step_and_a_picked_one(checkpoint):
    """Replay: at every engine step the lens shows the token drawn by then; a pick shows any token."""
    # the app's modules here, not at the top: they import gradio (seconds), which only this test needs
    from app.serving.recording import ReplayCursor, record_request
    from app.serving.requests import build_body
    from tests.service_utils import app_service, run_to_end, started
    with started(app_service(checkpoint, "--num-kv-blocks", "64", model="llama")) as svc:
        body = build_body(model="m", system="", user="a fox", temperature=0.0, top_k=0, top_p=1.0, max_tokens=5,
                          seed=None, speculative=False, k=1, trace_level="full") | {"ignore_eos": True}
        rid, _ = run_to_end(svc, body)
        rec = record_request(svc.store, rid, svc.model_info(), svc.piece, svc.is_special)
    # (in the order computed: the first and last tokens' at their steps, the rest after the last)
    lens = sorted((e for e in rec.events if e["type"] == "logit_lens"), key=lambda e: e["position"])
    assert len(lens) == 5
    cursor = ReplayCursor(rec)
    seen = []
    for frame in range(cursor.last_frame + 1):
        view = cursor.goto(frame)
        drawn = [e for e in view.events if e["type"] == "logit_lens"]
        html = view.render("logit_lens")
        if drawn:
            assert f"token {len(drawn)} of {len(drawn)} · position {drawn[-1]['position']} " in html
            seen.append(len(drawn))
        else:
            assert "no token generated yet" in html
    assert seen[-1] == 5 and seen == sorted(seen)
    view.select(lens[1]["position"] - 1)  # the pass that read the token before lens[1]'s drew it
    assert f"token 2 of 5 · position {lens[1]['position']} " in view.render("logit_lens")
