"""Nothing after an end of sequence is captured or reported (issue 25, item 3): a speculative
round that draws its end of sequence among its proposals verified positions past it, and
neither its spec event, nor the embedding, attention and MoE rows of that pass, nor the
speculative totals may show them. The embedded model and its draft, greedy: the last round
proposes ' it', '.', '<|end|>', '\n' and the target accepts all four (before the fix: "4/4
accepted" and a bonus '<|bos|>', all after the end counted and captured)."""
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


def test_trace_truncated_says_where_the_captures_stopped():
    """A reader that stops the captures from its sink, inside step 5: the note names that step,
    the position its decode pass read (the newest token) and the answer token it predicted;
    no capture comes after it. Stopped between steps, the note names the next pass."""
    sink = EventList()
    engine = LLMEngine(DEFAULT_MODEL, device="cpu", tracer=Tracer(sink), trace_level="full")
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
    heavy = [e for e in sink.of(rid) if e.type in ("attention", "embed", "moe", "logit_lens")]
    assert heavy and max(e.step for e in heavy) == 5 and len(out.token_ids) == 12

    sink.events.clear()
    rid = engine.add_request("Once upon a time", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    for _ in range(3):
        engine.step()
    engine.stop_captures(rid, 99)
    seq_tokens = len(engine.requests[rid].output_token_ids)
    note = sink.of(rid, "trace.truncated")[0].data
    assert note == {"limit_bytes": 99, "first_step": engine.step_count + 1,
                    "position": prompt + seq_tokens - 1, "token_index": seq_tokens}


def test_totals_and_counts_say_one_round_and_the_tokens_kept(run):
    _, out, rounds, _ = run
    t = totals(rounds)
    assert t.kept == len(out.token_ids) - 1 and t.own == len(rounds) - 1  # the last round added none
    assert t.per_pass == pytest.approx(t.kept / len(rounds))
    assert count(1, "round") == "1 round" and count(2, "round") == "2 rounds"
    one = spec_html(rounds[-1:])
    assert "rounds: <b>1</b>" in one and f"{rounds[-1]['accepted']:.2f} tokens per target pass" in one
    assert "the answer ended here" in one and "not counted" in one
