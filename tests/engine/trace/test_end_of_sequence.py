"""Nothing after an end of sequence is captured or reported (issue 25, item 3): a speculative
round that draws its end of sequence among its proposals verified positions past it, and
neither its spec event, nor the embedding, attention and MoE rows of that pass, nor the
speculative totals may show them. The embedded model and its draft, greedy: the last round
proposes ' it', '.', '<|end|>', '\n' and the target accepts all four (before the fix: "4/4
accepted" and a bonus '<|bos|>', all after the end counted and captured)."""
from dataclasses import replace

import pytest

from engine import EventList, SamplingParams, Tracer
from engine.llm_engine import DEFAULT_MODEL, LLMEngine
from visualizers.compact import per_layer
from visualizers.speculative import count, spec_html, totals

QUESTION = [{"role": "user", "content": "Once upon a time"}]
DRAFT = DEFAULT_MODEL.parent / "draft"


@pytest.fixture(scope="module")
def run():
    sink = EventList()
    engine = LLMEngine(DEFAULT_MODEL, device="cpu", draft=DRAFT, num_speculative_tokens=4,
                       tracer=Tracer(sink), trace_level="full")
    rid = engine.add_request(messages=QUESTION, params=SamplingParams(temperature=0, max_tokens=60))
    while engine.has_unfinished_requests():
        engine.step()
    out = engine.get_output(rid)
    assert out.finish_reason == "stop"
    return engine, out, [e.data for e in sink.of(rid, "spec")], sink.of(rid)


def test_the_last_round_stops_at_the_end_of_sequence(run):
    engine, out, rounds, _ = run
    last = rounds[-1]
    eos = out.token_ids[-1]
    assert eos in engine.model_config.eos_token_ids
    kept = last["proposed"][:last["accepted"]] + ([last["token"]] if last["token"] is not None else [])
    assert kept[-1] == eos and eos not in kept[:-1]  # the round's tokens end at the end of sequence
    assert eos not in last["proposed"][:-1]  # and it proposes nothing after it
    assert last["k"] == len(last["proposed"]) == len(last["proposed_text"]) == len(last["target_probs"])


def test_speculative_totals_count_only_the_tokens_kept(run):
    engine, out, rounds, _ = run
    kept = sum(r["accepted"] + (r["token"] is not None) for r in rounds)
    assert kept == len(out.token_ids) - 1  # every token but the first (the prefill's) came from a round
    load = engine.load()
    assert load.spec_accepted == sum(r["accepted"] for r in rounds)
    assert load.spec_proposed == sum(r["k"] for r in rounds)
    html = spec_html(rounds)
    assert f"accepted <b>{load.spec_accepted}</b>" in html
    assert f"{kept / len(rounds):.2f} tokens per target pass" in html


def test_no_row_is_captured_past_the_end(run):
    """The last token (the end of sequence) was never an input: every captured row read one
    of the positions before it, the same as without speculation."""
    _, out, _, events = run
    last_read = len(out.prompt_token_ids) + len(out.token_ids) - 2
    embed = [e.data for e in events if e.type == "embed"]
    assert max(e["start"] + len(e["token_ids"]) - 1 for e in embed) == last_read
    assert all(e["shape"][0] == len(e["token_ids"]) for e in embed)
    attention = [e for e in per_layer(e.data for e in events if e.type == "attention")]
    assert max(e["q_start"] + len(e["probs"][0]) - 1 for e in attention) == last_read
    assert all(e["k_start"] + len(e["probs"][0][0]) - 1 <= last_read for e in attention)
    moe = [e.data for e in events if e.type == "moe"]
    assert moe and max(e["start"] + len(e["experts"]) - 1 for e in moe) == last_read


HEAVY = ("attention", "embed", "moe", "logit_lens")


@pytest.mark.parametrize("live", [0.0, None])
def test_trace_truncated_says_where_the_captures_stopped(live):
    """A reader that stops the captures from its sink, on step 5's attention: the note names that
    step, the position its decode pass read (the newest token) and the answer token it predicted;
    every pass before it has its captures, none after it. Stopped between steps, the note names
    the oldest pass whose captures were not out yet: the next pass where each step's were built
    at it (live 0), the prompt's pass where all wait for the answer's end (None). Clock-free:
    which steps are built live is set, not timed."""
    sink = EventList()
    engine = LLMEngine(DEFAULT_MODEL, device="cpu", tracer=Tracer(sink), trace_level="full")
    engine.capture = replace(engine.capture, lens_live_seconds=live)
    rid = engine.add_request("Once upon a time", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))

    def cap(event):
        if event.type == "attention" and event.step == 5:
            engine.stop_captures(rid, 1234)
    engine.tracer.add_sink(cap)
    while engine.has_unfinished_requests():
        engine.step()
    out = engine.get_output(rid)
    note = [e for e in sink.of(rid, "trace.truncated")]
    assert len(note) == 1 and note[0].step == 5
    prompt = len(out.prompt_token_ids)
    # step 1 prefilled and drew answer token 0; step 5's pass read token 3 (position prompt + 3) and predicted 4
    assert note[0].data == {"limit_bytes": 1234, "first_step": 5, "position": prompt + 3, "token_index": 4}
    for kind in ("attention", "embed", "logit_lens"):  # (step 5's lens came before its attention)
        assert sorted(e.step for e in sink.of(rid, kind)) == [1, 2, 3, 4, 5], kind
    assert max(e.step for e in sink.of(rid) if e.type in HEAVY) == 5 and len(out.token_ids) == 12
    assert len(sink.of(rid, "sample")) == 12  # (not a capture: every token's)

    sink.events.clear()
    rid = engine.add_request("Once upon a time", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    first = engine.step_count + 1
    for _ in range(3):
        engine.step()
    engine.stop_captures(rid, 99)
    seq_tokens = len(engine.requests[rid].output_token_ids)
    note = sink.of(rid, "trace.truncated")[0].data
    if live == 0.0:
        assert note == {"limit_bytes": 99, "first_step": engine.step_count + 1,
                        "position": prompt + seq_tokens - 1, "token_index": seq_tokens}
    else:
        assert note == {"limit_bytes": 99, "first_step": first, "position": 0, "token_index": 0}
    while engine.has_unfinished_requests():
        engine.step()
    assert {e.step for e in sink.of(rid) if e.type in HEAVY} == set(range(first, note["first_step"]))
    assert len(sink.of(rid, "sample")) == 12 and sink.of(rid)[-1].type == "finish"


def test_totals_and_counts_say_one_round_and_the_tokens_kept(run):
    _, out, rounds, _ = run
    t = totals(rounds)
    assert t.kept == len(out.token_ids) - 1 and t.own == len(rounds) - 1  # the last round added none
    assert t.per_pass == pytest.approx(t.kept / len(rounds))
    assert count(1, "round") == "1 round" and count(2, "round") == "2 rounds"
    one = spec_html(rounds[-1:])
    assert "rounds: <b>1</b>" in one and f"{rounds[-1]['accepted']:.2f} tokens per target pass" in one
    assert "the answer ended here" in one and "not counted" in one


def test_the_finish_comes_after_the_last_steps_captures(run):
    """A reader (the app's stream, the trace store) takes `finish` as the end: the last step's
    embedding, attention and MoE rows and its spec event come before it."""
    _, _, _, events = run
    types = [e.type for e in events]
    assert types.count("finish") == 1
    end = types.index("finish")
    last = max(e.step for e in events if e.type in ("attention", "embed", "moe", "spec"))
    assert last == events[end].step and all(e.type in ("kv.free", "kv.pool") for e in events[end + 1:])
