"""The stages' words (visualizers/stages/, shared by the page and the classroom) on recordings
of real engine runs: the prefix-cache stage says what happened (a hit or a miss), the
embedding stage names one size for each thing it counts and agrees with the panel, the stream
stage explains speculative bursts, the beyond-one-GPU stage never splits a head nor suggests a
split it rules out, and the sampling and lens words speak of the pass their panels show."""
from __future__ import annotations

import re

import pytest

from app.serving.recording import ReplayCursor
from tests.service_utils import app_service, record_run, started, walk
from visualizers._html import show_piece
from visualizers.embedding import embedding_matrix
from visualizers.journey import journey


def first(rec, kind: str) -> dict:
    return next(e for e in rec.events if e["type"] == kind)


@pytest.fixture(scope="module")
def embedded():
    """The embedded MoE target with its embedded draft (speculative decoding on)."""
    with started(app_service(None, model=None)) as svc:
        yield svc


@pytest.fixture(scope="module")
def miss_then_hit(embedded):
    return record_run(embedded, "What is a token?"), record_run(embedded, "And what is an embedding?")


def test_the_prefix_stage_says_what_happened_to_this_request(miss_then_hit):
    miss, hit = miss_then_hit
    look = first(miss, "prefix_cache.lookup")
    assert not look["hit"] and look["full_blocks"] >= 2
    text = walk(miss)["prefix"]
    assert "A <b>MISS</b>" in text and "HIT</b>" not in text and "would" not in text
    assert f"all <b>{look['prompt_tokens']}</b> prompt tokens are computed now" in text
    blocks = look["full_blocks"]
    assert f"find <b>{blocks}</b> blocks (<b>{blocks * hit.model['block_size']}</b> tokens), a HIT" in text
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
    plain = record_run(embedded, "One token at a time, please.", system="", max_tokens=8, speculative=False)
    text = walk(plain)["answer"]
    assert "Between tokens:" in text and "burst" not in text


@pytest.fixture(scope="module")
def nine_heads(tmp_path_factory):
    """A tiny Llama with SmolLM2's head layout: 9 query heads on 3 KV heads."""
    from tests.tiny import make_checkpoint
    path = make_checkpoint("llama", tmp_path_factory.mktemp("nine"), num_heads=9, num_kv_heads=3,
                           hidden_size=144)
    with started(app_service(None, "--model", str(path), model=None)) as svc:
        yield svc


def test_the_parallel_stage_never_splits_a_head(nine_heads, miss_then_hit):
    rec = record_run(nine_heads, "Split me.", system="", max_tokens=4)
    assert (rec.model["num_heads"], rec.model["num_kv_heads"]) == (9, 3)
    text = walk(rec)["parallel"]
    assert "N devices must therefore divide the 3 KV heads: N = 3 for this model" in text
    assert "each device holds 3 of the 9 query heads and 1 of the 3 KV heads" in text
    assert "N = 2 does not work: 3 KV heads do not split in two" in text
    assert "--tensor-parallel-size 2" not in text and "<code>--tensor-parallel-size 3</code> splits it" in text
    assert "the 3 query heads of each KV head must sit on the device that holds it" in text
    for words in (text, walk(miss_then_hit[0])["parallel"]):  # 8 query heads on 2 KV heads: N = 2
        assert not re.search(r"\d+\.\d+ of", words)  # never 4.5 of 9 heads, 1.5 of 3 layers...
    assert "N = 2 for this model" in walk(miss_then_hit[0])["parallel"]


def test_the_sampling_and_lens_words_speak_of_the_pass_their_panels_show(miss_then_hit):
    rec = miss_then_hit[0]
    view = ReplayCursor(rec).goto(10**9)  # the end, as the page and the classroom draw it
    # the panels' default: the newest pass (events come in the order computed: a live step's before the
    # steps between the live ones, built after the answer)
    last = max((e for e in rec.events if e["type"] == "sample"), key=lambda e: (e["step"], e["position"]))
    assert f"position {last['position']} ·" in view.render("sampling")
    text = walk(rec)
    read = show_piece(view.labels()[last["position"] - 1])
    for key in ("sampling", "logit_lens"):
        assert f"the pass that read «{read}» (position {last['position'] - 1:,}) and predicted" in text[key], key
        assert "first answer token" not in text[key]
    assert f"drew «{show_piece(last['token_text'])}» with probability" in text["sampling"]


def test_the_prefill_batching_and_head_words_fit_this_request(miss_then_hit):
    miss, hit = miss_then_hit
    look = first(hit, "prefix_cache.lookup")
    text = walk(hit)["timeline"]
    assert "the whole prompt" not in text  # part of it came from the cache
    assert (f"<b>{look['prompt_tokens'] - look['cached_tokens']}</b> prompt tokens not found in the prefix cache "
            f"(<b>{look['cached_tokens']}</b> of the <b>{look['prompt_tokens']}</b> came from it)") in text
    assert "the whole prompt (<b>" in walk(miss)["timeline"]
    batching = walk(miss)["batching"]  # one request at a time on this service
    assert "were shared with <b>0</b>" not in batching and "This request ran alone" in batching
    one_kv = {**miss.model, "num_heads": 4, "num_kv_heads": 1}
    words = " ".join(s.text for s in journey(one_kv, miss.request_id, miss.body, miss.events, miss.outputs))
    assert "1 KV heads" not in words and "1</b> key/value heads" not in words
    assert "a single key/value head" in words and "× 1 KV head ×" in words


def test_every_page_panel_sits_under_exactly_one_stage(miss_then_hit):
    from app.page.live_view import PANELS
    rec = miss_then_hit[0]
    st = journey(rec.model, rec.request_id, rec.body, rec.events, rec.outputs)
    placed = [p for s in st for p in s.panels]
    assert sorted(placed) == sorted(set(placed)) and set(placed) <= set(PANELS)
    assert set(PANELS) - set(placed) == set()  # the embedded model is an MoE: its routing is shown too
    dense = journey({**rec.model, "is_moe": False}, rec.request_id, rec.body, rec.events, rec.outputs)
    assert "moe" not in [p for s in dense for p in s.panels]  # a dense model has no half-empty MoE panel


def test_a_plain_prompt_is_told_as_one(embedded):
    """POST /v1/completions: no messages and no chat template, said so (not "0 messages")."""
    from app.serving.recording import record_request
    from tests.service_utils import run_to_end
    body = {"model": "m", "prompt": "Once upon a time", "max_tokens": 4, "trace_level": "full", "temperature": 0}
    rid, _ = run_to_end(embedded, body)
    rec = record_request(embedded.store, rid, embedded.model_info(), embedded.piece, embedded.is_special)
    text = walk(rec)
    assert "0</b> messages" not in text["request"]
    assert f"a plain prompt (POST /v1/completions, no chat messages) of <b>{len(body['prompt'])}</b> characters" \
        in text["request"]
    tok = first(rec, "tokenize")
    assert not tok["chat_template"] and "role markers" not in text["tokens"] and "no chat template" in text["tokens"]


def test_a_trail_reads_a_growing_trace_once_and_says_the_same(miss_then_hit):
    """The page calls journey() several times a second while a request streams: with a Trail
    each call reads only the new events, and the words are those of a call that read them all."""
    from visualizers.stages import Trail
    rec = miss_then_hit[1]
    whole = [(s.text, s.chip, s.skipped, s.reached) for s in journey(rec.model, rec.request_id, rec.body,
                                                                     rec.events, rec.outputs)]
    trail, live = Trail(rec.request_id), []
    for i in range(0, len(rec.events), 7):
        live.extend(rec.events[i:i + 7])
        out = journey(rec.model, rec.request_id, rec.body, live, rec.outputs, trail=trail)
        assert trail.read == len(live)
    assert [(s.text, s.chip, s.skipped, s.reached) for s in out] == whole
    # a rebuilt list (a replay moved back) is read again from its start, not appended to
    back = list(rec.events[:len(rec.events) // 2])
    again = journey(rec.model, rec.request_id, rec.body, back, rec.outputs, trail=trail)
    fresh = journey(rec.model, rec.request_id, rec.body, back, rec.outputs)
    assert [s.text for s in again] == [s.text for s in fresh] and trail.read == len(back)


def test_a_request_traced_at_level_off_passes_every_stage_of_its_path(embedded):
    """Capture level off keeps only the streamed outputs: the map still lights the whole path
    up to the stream, and the words say what was not recorded instead of "not reached yet"."""
    from app.serving.recording import Recording
    from tests.service_utils import run_to_end
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "trace_level": "off"}
    rid, items = run_to_end(embedded, body)
    outputs = [i for i in items if i["type"] == "output"]
    rec = Recording(rid, embedded.model_info(), body, [], outputs)
    st = journey(rec.model, rid, body, [], outputs)
    path = [s for s in st if s.key in ("request", "tokens", "prefix", "embedding", "layers", "timeline", "kv",
                                       "logit_lens", "sampling", "answer")]
    assert all(s.reached for s in path), [s.key for s in path if not s.reached]
    assert not any("Not reached yet" in s.text for s in st)
    gen = sum(1 for o in outputs if o.get("token_id", -1) >= 0)
    assert next(s for s in st if s.key == "answer").chip == (f"{gen} token" if gen == 1 else f"{gen} tokens")
    assert "capture level (off)" in next(s for s in st if s.key == "prefix").text


def test_the_map_never_rounds_a_drawn_tokens_probability_to_zero():
    from visualizers.stages.way_out import prob_chip
    assert prob_chip(0.721) == "p 0.72" and prob_chip(0.0041) == "p 0.0041" and prob_chip(0.05) == "p 0.05"


def test_the_stream_stage_in_a_classroom_draws_no_line_about_the_pages_n_control(miss_then_hit):
    from app.classroom.rooms import Classrooms
    rec = miss_then_hit[0]
    room = Classrooms().create(rec)
    i = next(j for j, s in enumerate(room.stage_list()) if s.key == "answer")
    html = room.render(i)
    assert "tt-answer" in html and "Choices n" not in html
