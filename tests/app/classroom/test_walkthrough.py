"""Classroom mode's words on recordings of real engine runs: the prefix-cache stage says
what happened (a hit or a miss), the embedding stage names one size for each thing it counts
and agrees with the panel, the stream stage explains speculative bursts, and the
beyond-one-GPU stage never splits a head."""
from __future__ import annotations

import re

import pytest

from app.__main__ import build_service, parse_args
from app.serving.recording import ReplayCursor, record_request
from app.serving.requests import build_body
from tests.service_utils import run_to_end
from visualizers.embedding import embedding_matrix
from visualizers.walkthrough import stages

SYSTEM = ("You are a patient teacher. You explain every step of how a language model answers, from the tokens "
          "to the sampling, and you always give a short example.")


def run(svc, user: str, system: str = SYSTEM, max_tokens: int = 24, speculative: bool = True):
    body = build_body("m", system, user, 0.8, 0, 1.0, max_tokens, 5, speculative, 4, "full") | {"ignore_eos": True}
    rid, _ = run_to_end(svc, body, timeout_s=120)
    return record_request(svc.store, rid, svc.model_info(), svc.piece, svc.is_special)


def walk(rec) -> dict[str, str]:
    cursor = ReplayCursor(rec)
    peak = cursor.goto(cursor.peak_kv_frame()).pool
    return {s.key: s.text for s in stages(rec.model, rec.request_id, rec.body, rec.events, rec.outputs, peak,
                                           rec.truncated)}


def first(rec, kind: str) -> dict:
    return next(e for e in rec.events if e["type"] == kind)


@pytest.fixture(scope="module")
def embedded():
    """The embedded MoE target with its embedded draft (speculative decoding on)."""
    svc = build_service(parse_args([])).start()
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def miss_then_hit(embedded):
    return run(embedded, "What is a token?"), run(embedded, "And what is an embedding?")


def test_the_prefix_stage_says_what_happened_to_this_request(miss_then_hit):
    miss, hit = miss_then_hit
    look = first(miss, "prefix_cache.lookup")
    assert not look["hit"] and look["full_blocks"] >= 2
    text = walk(miss)["prefix"]
    assert "A <b>MISS</b>" in text and "HIT</b>" not in text and "would" not in text
    assert f"all <b>{look['prompt_tokens']}</b> prompt tokens are computed now" in text
    assert f"begins with the same <b>{look['full_blocks'] * hit.model['block_size']}</b> tokens" in text
    look = first(hit, "prefix_cache.lookup")
    assert look["hit"] and look["cached_tokens"] > 0
    text = walk(hit)["prefix"]
    assert "A <b>HIT</b>" in text and "MISS" not in text and "would" not in text
    assert f"<b>{look['cached_tokens']}</b> of the <b>{look['prompt_tokens']}</b> prompt tokens reuse" in text
    assert f"only the other <b>{look['prompt_tokens'] - look['cached_tokens']}</b> are computed now" in text


def test_the_embedding_stage_names_each_size_and_agrees_with_the_panel(miss_then_hit):
    for rec in miss_then_hit:
        text = walk(rec)["embedding"]
        n_prompt, d = first(rec, "tokenize")["count"], rec.model["hidden_size"]
        embeds = [e for e in rec.events if e["type"] == "embed"]
        shown = embedding_matrix(embeds)[0].shape[0]  # what the panel draws: one row per position
        total = sum(len(e["token_ids"]) for e in embeds)
        cached = first(rec, "prefix_cache.lookup")["cached_tokens"]
        assert f"prompt is <b>{n_prompt}</b> tokens: a [{n_prompt:,} × {d:,}] matrix" in text
        assert f"one per position: [{shown:,} × {d:,}]" in text
        in_prompt = re.search(r"that is <b>(\d+)</b> of the <b>(\d+)</b> prompt positions", text)
        assert in_prompt and int(in_prompt[1]) == n_prompt - cached and int(in_prompt[2]) == n_prompt
        assert f"and <b>{shown - (n_prompt - cached)}</b> after the prompt" in text
        assert (f"the first <b>{cached}</b> came from the prefix cache" in text) == bool(cached)
        if total > shown:  # speculative verify passes look some positions up again: said, with the count
            assert f"<b>{total}</b> rows went in: <b>{total - shown}</b> lookups" in text
            assert "rejected proposal" in text
        # no other [a × b] size is quoted
        assert set(re.findall(r"\[([\d,]+) × ", text)) == {f"{n_prompt:,}", f"{shown:,}"}


def test_the_stream_stage_explains_speculative_bursts(embedded, miss_then_hit):
    rec = miss_then_hit[1]
    tokens = [e for e in rec.events if e["type"] == "token"]
    steps = {e["step"] for e in tokens}
    assert len(steps) < len(tokens)  # several tokens left in one step
    text = walk(rec)["answer"]
    assert f"came in <b>{len(steps)}</b> bursts" in text and "microseconds apart" in text
    gap = re.search(r"between bursts: ([\d.]+) (ms|s) at the median", text)
    assert gap and float(gap[1]) > 0
    plain = run(embedded, "One token at a time, please.", system="", max_tokens=8, speculative=False)
    text = walk(plain)["answer"]
    assert "Between tokens:" in text and "burst" not in text


@pytest.fixture(scope="module")
def nine_heads(tmp_path_factory):
    """A tiny Llama with SmolLM2's head layout: 9 query heads on 3 KV heads."""
    from tests.tiny import make_checkpoint
    path = make_checkpoint("llama", tmp_path_factory.mktemp("nine"), num_heads=9, num_kv_heads=3,
                           hidden_size=144)
    svc = build_service(parse_args(["--model", str(path)])).start()
    yield svc
    svc.stop()


def test_the_parallel_stage_never_splits_a_head(nine_heads, miss_then_hit):
    rec = run(nine_heads, "Split me.", system="", max_tokens=4)
    assert (rec.model["num_heads"], rec.model["num_kv_heads"]) == (9, 3)
    text = walk(rec)["parallel"]
    assert "N devices must therefore divide the 3 KV heads: N = 3 for this model" in text
    assert "each device holds 3 of the 9 query heads and 1 of the 3 KV heads" in text
    assert "N = 2 does not work: 3 KV heads do not split in two" in text
    assert "the 3 query heads of each KV head must sit on the device that holds it" in text
    for words in (text, walk(miss_then_hit[0])["parallel"]):  # 8 query heads on 2 KV heads: N = 2
        assert not re.search(r"\d+\.\d+ of", words)  # never 4.5 of 9 heads, 1.5 of 3 layers...
    assert "N = 2 for this model" in walk(miss_then_hit[0])["parallel"]
