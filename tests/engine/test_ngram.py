"""Speculative decoding by n-gram prompt lookup (draft="ngram"): the proposer alone,
exact greedy output, the target's distribution when sampling, seeded draws in any batch,
long copied runs where the answer repeats its context, and the trace and panels that
say where each proposal was copied from."""
import random
import re

import pytest
import torch
from scipy.stats import chi2

import engine.llm_engine
import visualizers as viz
from engine import LLM, SamplingParams, TraceEvent
from engine.speculative.ngram import NgramProposer, find_ngram
from engine.speculative.verify import verify
from engine.sequence import Sequence
from tests.engine_utils import DEVICE
from tests.sampling_reference import KNOBS, WORDS, chi_square, first_three, joint_distribution
from tests.tiny import VOCAB, load_reference, make_checkpoint, save_tokenizer
from visualizers.journey import journey

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
# repetitive prompts, so that matches are found (and, on random models, mostly rejected)
PROMPTS = [list(range(10, 20)) * 3, [5, 6, 7] * 5, [42] * 9, [3, 9, 4, 9, 3, 9, 4], list(range(100, 141))]
XSS = ["<img src=x onerror=alert(1)>", "</script><b>x", "\"'><svg onload=alert(2)>"]


# --- the proposer alone ------------------------------------------------------------------
def test_the_latest_earlier_occurrence_wins():
    tokens = [1, 2, 3, 9, 1, 2, 3, 8, 5, 1, 2, 3]
    m = find_ngram(tokens, 4, max_n=4, min_n=1)
    assert (m.start, m.n, m.tokens) == (4, 3, [8, 5, 1, 2])  # [1 2 3] at 0 and at 4: the later one
    assert m.sources == [7, 8, 9, 10] and [tokens[i] for i in m.sources] == m.tokens


def test_longer_ngrams_are_tried_first():
    tokens = [6, 1, 2, 3, 7, 0, 2, 3, 8, 1, 2, 3]
    assert find_ngram(tokens, 2, max_n=4, min_n=1) == find_ngram(tokens, 2, max_n=3, min_n=3)
    m = find_ngram(tokens, 2, max_n=4, min_n=1)
    assert (m.start, m.n, m.tokens) == (1, 3, [7, 0])  # [1 2 3]; [2 3] alone occurs later, at 6
    m = find_ngram(tokens, 2, max_n=2, min_n=1)
    assert (m.start, m.n, m.tokens) == (6, 2, [8, 1])


def test_no_match_no_proposal():
    assert find_ngram([1, 2, 3, 4], 4, max_n=4, min_n=1) is None
    assert find_ngram([5, 1, 6, 1], 4, max_n=4, min_n=2) is None  # only a 1-gram repeats
    assert find_ngram([5, 1, 6, 1], 4, max_n=4, min_n=1).tokens == [6, 1]
    assert find_ngram([7], 4, max_n=4, min_n=1) is None
    assert find_ngram([1, 2, 1, 2], 0, max_n=4, min_n=1) is None


def test_never_more_than_k_nor_past_the_context():
    tokens = list(range(20)) + list(range(3))
    for k in range(1, 8):
        assert find_ngram(tokens, k, 4, 1).tokens == list(range(3, 3 + k))
    assert find_ngram([1, 2, 1], 5, 4, 1).tokens == [2, 1]  # what follows runs into the end


def test_proposer_fills_one_hot_proposals_of_the_scheduled_size():
    from engine.sequence import ScheduledSeq
    prop = NgramProposer(3, 2, vocab_size=16, device=torch.device("cpu"))
    seq = Sequence("r", [1, 2, 3, 4, 5, 1, 2], SamplingParams(), None)
    assert prop.lookahead(seq, 9) == 5 and prop.lookahead(seq, 2) == 2
    assert prop.lookahead(Sequence("s", [1, 2, 3], SamplingParams(), None), 4) == 0
    item = ScheduledSeq(seq, 6, 3, num_draft=2)
    prop.propose([item])
    assert item.draft_tokens == [3, 4]
    assert [q.tolist() for q in item.draft_probs] == [[float(i == x) for i in range(16)] for x in (3, 4)]
    info = prop.describe(seq, str)
    assert info["copied_from"] == [2, 3] and info["ngram"] == {"n": 2, "start": 0, "tokens": [1, 2], "text": ["1", "2"]}
    prop.free(seq)
    assert not prop.matches
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        NgramProposer(2, 3, 16, torch.device("cpu"))


def test_one_hot_q_keeps_a_copy_with_probability_p_and_redraws_without_it():
    """verify() with q one-hot at x: kept with probability p(x); a rejection never redraws x."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    params = SamplingParams(temperature=1.0)
    p = torch.softmax(logits[0], -1)
    q = [torch.tensor([1.0, 0, 0, 0])]
    g = torch.Generator().manual_seed(0)
    verdicts = [verify(logits, [0], q, params, g) for _ in range(4000)]
    kept = sum(v.accepted for v in verdicts) / len(verdicts)
    assert abs(kept - float(p[0])) < 0.03
    redrawn = [v.tokens[0] for v in verdicts if not v.accepted]
    assert 0 not in redrawn
    assert abs(redrawn.count(1) / len(redrawn) - float(p[1] / (1 - p[0]))) < 0.05
    assert {v.draft_probs[0] for v in verdicts} == {1.0}


# --- models ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def successor(tmp_path_factory):
    """A tiny Llama built to continue a chain: it ignores context (attention and MLP
    outputs are zero) and its next token is succ(last token), succ a fixed random
    permutation. A prompt that holds a stretch of the chain, then starts it again, is
    text the model goes on to repeat: n-gram lookup should then be right every time."""
    import transformers
    path = tmp_path_factory.mktemp("successor")
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    succ = torch.randperm(VOCAB, generator=g)
    with torch.no_grad():
        emb = torch.randn(VOCAB, 64, generator=g)
        model.model.embed_tokens.weight.copy_(emb)
        model.lm_head.weight.copy_(emb[torch.argsort(succ)] * 4)  # row succ[x] is x's embedding
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(str(path))
    save_tokenizer(path)
    chain = [7]
    while len(chain) < 48:
        chain.append(int(succ[chain[-1]]))
    assert len(set(chain)) == len(chain)  # no cycle this short: no repeats but the prompt's own
    other = [t for t in range(2, VOCAB) if t not in chain][:2]
    return path, chain, other


@pytest.fixture(scope="module")
def tiny(checkpoint):
    return {arch: checkpoint(arch) for arch in ("llama", "mixtral")}


@pytest.fixture(scope="module")
def reference(tiny):
    return {arch: [o.token_ids for o in LLM(path, device=DEVICE, block_size=4).generate(PROMPTS, GREEDY)]
            for arch, path in tiny.items()}


def ngram_llm(model=None, k: int = 4, **kw) -> LLM:
    return LLM(model, device=DEVICE, draft="ngram", num_speculative_tokens=k, **kw)


# --- greedy: exactly the plain engine's tokens -------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 4, 6])
@pytest.mark.parametrize("arch", ["llama", "mixtral"])
def test_greedy_is_identical_with_ngram_lookup(tiny, reference, arch, k):
    llm = ngram_llm(tiny[arch], k, block_size=4, max_num_batched_tokens=16)  # chunked prefill beside rounds
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == reference[arch]
    stats = llm.engine.stats
    assert stats.spec_proposed > 0 and stats.spec_accepted < stats.spec_proposed  # rejections rolled back
    assert llm.engine.speculative_method == "ngram" and not llm.engine.speculator.matches
    bm = llm.engine.block_manager
    bm.check_invariants([])
    assert bm.num_free_blocks == bm.num_blocks


def test_greedy_with_ngram_lookup_and_prefix_caching(tiny, reference):
    llm = ngram_llm(tiny["mixtral"], 3, block_size=4)
    first = llm.generate(PROMPTS, GREEDY)
    again = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in first] == [o.token_ids for o in again] == reference["mixtral"]
    assert sum(o.usage.cached_tokens for o in again) >= sum((len(p) - 1) // 4 * 4 for p in PROMPTS)
    shared = [PROMPTS[4] + [7, 8, 9] * 3, PROMPTS[4] + [11]]
    cold = LLM(tiny["mixtral"], device=DEVICE, block_size=4, enable_prefix_caching=False)
    assert [o.token_ids for o in llm.generate(shared, GREEDY)] == [o.token_ids for o in cold.generate(shared, GREEDY)]


def test_greedy_matches_transformers_with_ngram_lookup(tiny):
    prompt = PROMPTS[0]
    with torch.no_grad():
        hf = load_reference(tiny["llama"]).generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                                                    eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert ngram_llm(tiny["llama"], 3).generate(prompt, GREEDY)[0].token_ids == hf


def test_a_repeated_text_is_copied_in_long_runs(successor):
    path, chain, other = successor
    prompt = chain[:20] + other + chain[:3]  # the text, something else, then its start again
    plain = LLM(path, device=DEVICE).generate(prompt, GREEDY)[0].token_ids
    assert plain == chain[3:27]  # the model does repeat it (and goes on)
    llm = ngram_llm(path, 4)
    items = list(llm.stream(prompt, GREEDY, trace="basic"))
    assert items[-1].token_ids == plain
    spec = [i.data for i in items if isinstance(i, TraceEvent) and i.type == "spec"]
    # after the prefill's chain[3]: 4 copies + 1 bonus per pass up to chain[18], then chain[19]
    # is copied and the distractor after it rejected; past the prompt's text nothing matches
    assert [ev["accepted"] for ev in spec] == [4, 4, 4, 1]
    assert [ev["copied_from"][0] for ev in spec] == [4, 9, 14, 19]
    stats = llm.engine.stats
    assert stats.spec_accepted == 13 and stats.target_passes == 1 + 4 + (24 - 1 - 17)


# --- the embedded model -------------------------------------------------------------------
SAID = "The only thing that you have to do is to be a good thing. The only thing that you have to do it."
REPEAT = [{"role": "user", "content": "Tell me something about life."}, {"role": "assistant", "content": SAID},
          {"role": "user", "content": "Repeat what you said."}]
CHATS = [REPEAT,
         [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Tell me a fortune."}],
         [{"role": "system", "content": "You are a helpful assistant."},
          {"role": "user", "content": "Say it again: the cat sat on the mat, the cat sat on the mat."}]]
LOOP = "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat."


@pytest.fixture(scope="module")
def embedded():
    return LLM(device=DEVICE)


@pytest.mark.parametrize("k", [2, 4])
def test_embedded_model_greedy_is_identical_in_batches_and_with_prefix_caching(embedded, k):
    params = SamplingParams(temperature=0, max_tokens=48)
    want = [o.token_ids for o in embedded.chat(CHATS, params)]
    want_loop = embedded.generate(LOOP, SamplingParams(temperature=0, max_tokens=80, ignore_eos=True))[0].token_ids
    llm = ngram_llm(None, k, block_size=8)
    assert [o.token_ids for o in llm.chat(CHATS, params)] == want
    again = llm.chat(CHATS, params)  # every full prompt block is cached now
    assert [o.token_ids for o in again] == want and all(o.usage.cached_tokens > 0 for o in again)
    assert llm.generate([LOOP] * 2, SamplingParams(temperature=0, max_tokens=80, ignore_eos=True))[1].token_ids \
        == want_loop
    stats = llm.engine.stats
    assert 0 < stats.spec_accepted < stats.spec_proposed


def test_embedded_model_copies_a_repeated_answer_in_long_runs():
    """Asked to repeat its last answer, the embedded model does, and lookup finds it."""
    llm = ngram_llm(None, 4)
    items = list(llm.stream(messages=REPEAT, params=SamplingParams(temperature=0, max_tokens=48), trace="basic"))
    out = items[-1]
    assert out.text == "The only thing that you have to do is to be a good thing."
    spec = [i.data for i in items if isinstance(i, TraceEvent) and i.type == "spec"]
    stats = llm.engine.stats
    assert stats.spec_accepted / stats.spec_proposed >= 0.6
    assert sum(ev["accepted"] == 4 for ev in spec) >= 2  # whole rounds of 4 copied tokens kept
    assert stats.target_passes <= len(out.token_ids) // 2  # 16 tokens in 5 passes (prefill included)


# --- sampling: the target's distribution, and seeded draws in any batch --------------------
@pytest.mark.slow  # 3,000 seeded requests
def test_sampled_output_follows_the_target_distribution(tmp_path, monkeypatch):
    """Chi-square test of the first three sampled tokens over many seeds against the
    target's exact joint distribution, with transformers' own warpers as the reference.
    Token 1 comes from the prefill; tokens 2-3 from a round of up to 3 copies (when the
    last token occurred before: every word but <eos> does) or from plain draws."""
    target = make_checkpoint("llama", tmp_path / "t", seed=1, num_layers=2, words=WORDS)
    prompt = [1, 2, 3, 4, 1, 2]
    n = 3000

    def observed_counts(n: int):
        llm = ngram_llm(target, 3, max_num_seqs=128, prompt_lookup_min=1)
        outs = llm.generate([prompt] * n, [SamplingParams(seed=i, max_tokens=5, ignore_eos=True, **KNOBS)
                                           for i in range(n)])
        return first_three(outs), llm.engine.stats

    expected = joint_distribution(target, prompt)
    observed, stats = observed_counts(n)
    assert stats.spec_proposed > n and 0 < stats.spec_accepted < stats.spec_proposed
    stat, dof = chi_square(observed, expected)
    assert stat < chi2.ppf(0.999, dof), (stat, dof)
    # The test has the power to catch a rule that keeps every copy the target allows (q ~ 0).
    monkeypatch.setattr(engine.llm_engine, "verify",
                        lambda lg, xs, qs, sp, g: verify(lg, xs, [q * 1e-9 for q in qs], sp, g))
    broken, _ = chi_square(observed_counts(1000)[0], expected)
    assert broken > chi2.ppf(0.999, dof)


@pytest.mark.parametrize("num_kv_blocks", [40, 14])  # 14: the request is preempted on the way
def test_seeded_request_draws_the_same_tokens_in_any_batch(tiny, num_kv_blocks):
    params = SamplingParams(temperature=1.0, top_k=3, top_p=0.95, seed=3, max_tokens=20, ignore_eos=True)
    alone = ngram_llm(tiny["mixtral"], 4, block_size=4, prompt_lookup_min=1)
    want = alone.generate(PROMPTS[0], params)[0]
    stats = alone.engine.stats
    assert 0 < stats.spec_accepted < stats.spec_proposed and stats.target_passes < 20  # rounds and plain steps
    crowded = ngram_llm(tiny["mixtral"], 4, block_size=4, max_num_batched_tokens=8, num_kv_blocks=num_kv_blocks,
                        prompt_lookup_min=1)
    others = [SamplingParams(temperature=0.7, seed=i, max_tokens=20, ignore_eos=True) for i in range(5)]
    outs = crowded.generate(PROMPTS[:4] + [[9, 8, 7], PROMPTS[0]], others + [params])
    assert outs[-1].token_ids == want.token_ids
    assert outs[-1].usage.cached_tokens > 0  # it shared the first request's prompt blocks
    assert (outs[-1].metrics["preemptions"] > 0) == (num_kv_blocks == 14)


def test_seeded_requests_match_alone_under_random_crowds(tiny):
    """Random workloads over a small alphabet (so matches come and go): budgets down to
    one round, small pools (preemption), shared prompts (prefix hits), mixed knobs."""
    rng = random.Random(4)
    alone, preempted, accepted = {}, 0, 0
    for _ in range(6):
        k = rng.randint(1, 5)
        if k not in alone:
            alone[k] = ngram_llm(tiny["mixtral"], k, block_size=4, prompt_lookup_min=1)
        prompts = [[rng.randrange(4, 12) for _ in range(rng.randint(1, 30))] for _ in range(rng.randint(2, 7))]
        prompts[-1] = list(prompts[0])
        params = [SamplingParams(temperature=rng.choice([0.3, 1.0]), top_p=rng.choice([1.0, 0.9]),
                                 top_k=rng.choice([3, 20]), seed=rng.randrange(10**6),
                                 max_tokens=rng.randint(1, 24), ignore_eos=True) for _ in prompts]
        crowd = ngram_llm(tiny["mixtral"], k, block_size=4, prompt_lookup_min=1,
                          max_num_batched_tokens=rng.choice([k + 1, 8, 16]), num_kv_blocks=rng.choice([14, 16]),
                          max_num_seqs=rng.randint(2, 6))
        outs = crowd.generate(prompts, params)
        for p, sp, o in zip(prompts, params, outs):
            assert o.token_ids == alone[k].generate(p, sp)[0].token_ids
        preempted += sum(o.metrics["preemptions"] for o in outs)
        accepted += crowd.engine.stats.spec_accepted
    assert preempted > 0 and accepted > 0


# --- the trace and what the page draws from it ------------------------------------------
def check_copies(spec: list[dict], context: list[int], max_n: int = 4) -> None:
    """Every round's copy source is a real, latest, longest earlier occurrence."""
    for ev in spec:
        assert ev["method"] == "ngram" and ev["draft_probs"] == [1.0] * ev["k"]
        at, n, start = ev["position"], ev["ngram"]["n"], ev["ngram"]["start"]
        tail = context[at - n:at]
        assert context[start:start + n] == tail == ev["ngram"]["tokens"] and start + n < at
        assert ev["copied_from"] == list(range(start + n, start + n + ev["k"]))
        assert [context[i] for i in ev["copied_from"]] == ev["proposed"] and ev["copied_from"][-1] < at
        assert not any(context[s:s + n] == tail for s in range(start + 1, at - n))  # latest
        for longer in range(n + 1, min(max_n, at - 1) + 1):  # no longer n-gram occurred
            assert not any(context[s:s + longer] == context[at - longer:at] for s in range(at - longer))
        # what was kept is what the context holds next
        assert context[at:at + ev["accepted"]] == ev["proposed"][:ev["accepted"]]


def test_spec_events_say_where_each_proposal_was_copied_from(successor, tiny):
    path, chain, other = successor
    for model, prompt, params in ((path, chain[:20] + other + chain[:3], GREEDY),
                                  (tiny["mixtral"], PROMPTS[0], GREEDY),
                                  (tiny["llama"], PROMPTS[3], SamplingParams(temperature=0.9, seed=1, max_tokens=30,
                                                                             ignore_eos=True))):
        items = list(ngram_llm(model, 4, prompt_lookup_min=1).stream(prompt, params, trace="basic"))
        final = items[-1]
        spec = [i.data for i in items if isinstance(i, TraceEvent) and i.type == "spec"]
        assert spec and all(ev["prompt_tokens"] == len(prompt) for ev in spec)
        assert all(ev["lookup"] == {"max_n": 4, "min_n": 1} for ev in spec)
        check_copies(spec, prompt + final.token_ids)
        samples = [i.data for i in items if isinstance(i, TraceEvent) and i.type == "sample"]
        assert [s["token_id"] for s in samples] == final.token_ids
        assert [s["source"] for s in samples].count("draft") == sum(ev["accepted"] for ev in spec)


@pytest.fixture(scope="module")
def repeat_trace():
    llm = ngram_llm(None, 4)
    events, outputs = [], []
    for item in llm.stream(messages=REPEAT, params=SamplingParams(temperature=0, max_tokens=48), trace="basic"):
        if isinstance(item, TraceEvent):
            events.append(item.to_dict())
        elif hasattr(item, "token_id"):
            outputs.append({"token_id": item.token_id, "text": item.text})
        else:
            final = item
    return llm, events, outputs, final


def test_embedded_trace_copies_point_at_earlier_occurrences(repeat_trace):
    _, events, _, final = repeat_trace
    spec = [e for e in events if e["type"] == "spec"]
    check_copies(spec, final.prompt_token_ids + final.token_ids)
    # the first round copies the earlier answer's start, right after the same role markers
    assert spec[0]["ngram"]["text"][-1] == "The" and spec[0]["copied_from"][-1] < spec[0]["prompt_tokens"]


def test_the_panel_shows_the_copy_source_and_escapes_text():
    ev = {"k": 2, "proposed": [7, 8], "proposed_text": XSS[:2], "draft_probs": [1.0, 1.0], "target_probs": [0.4, 0.1],
          "accepted": 1, "token": 9, "token_text": XSS[2], "token_kind": "corrected", "acceptance_rate": 0.5,
          "greedy": False, "method": "ngram", "position": 30, "copied_from": [12, 13], "prompt_tokens": 20,
          "ngram": {"n": 3, "start": 9, "tokens": [1, 2, 3], "text": [XSS[0], " the", XSS[2]]},
          "lookup": {"max_n": 4, "min_n": 2}}
    html = viz.spec_html([ev, dict(ev, copied_from=[22, 23, 24, 25], ngram=dict(ev["ngram"], start=18))])
    for bad in ("<img src=x", "</script>", "<b>x", "<svg onload", "onerror=alert(1)>"):
        assert bad not in html, bad
    assert "copied from tokens 12–13 of the prompt" in html and "3-gram" in html and "at tokens 9–11 of the prompt" in html
    assert "copied from tokens 2–5 of the answer so far" in html and "at tokens 18–20 of the prompt" in html
    assert "n-gram lookup" in html and "from 4 down to 2" in html and "acceptance rate <b>50%</b>" in html
    assert "&lt;img␣src=x␣onerror=alert(1)&gt;" in html and "␣the" in html
    assert 'copied from position 12' in html  # a proposal's hover
    # draft-model rounds look as before
    draft = {k: v for k, v in ev.items() if k not in ("method", "position", "copied_from", "prompt_tokens", "ngram",
                                                      "lookup")}
    plain = viz.spec_html([draft])
    assert "copied" not in plain and "draft q=1.00" in plain and "n-gram" not in plain  # prob(): the page's format


def test_the_classroom_explains_ngram_lookup_with_this_requests_numbers(repeat_trace):
    llm, events, outputs, final = repeat_trace
    e, cfg = llm.engine, llm.engine.model_config
    model = {"name": "m", "num_layers": cfg.num_layers, "num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads,
             "head_dim": cfg.head_dim, "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
             "num_experts": cfg.num_experts, "top_k": cfg.num_experts_per_tok, "is_moe": cfg.is_moe,
             "dtype": "float32", "dtype_bytes": 4, "num_blocks": e.block_manager.num_blocks,
             "block_size": e.config.block_size}
    text = {s.key: s.text for s in journey(model, final.request_id, None, events, outputs)}["spec"]
    spec = [ev for ev in events if ev["type"] == "spec"]
    accepted = sum(ev["accepted"] for ev in spec)
    assert "n-gram lookup" in text and "draft model proposed" not in text
    assert f"<b>{len(spec)}</b> rounds found a match" in text and f"kept <b>{accepted}</b>" in text
    best = max(spec, key=lambda ev: ev["accepted"])
    src = best["copied_from"]
    assert f"from tokens {src[0]}–{src[-1]} of the prompt" in text
    assert "«" + "".join(best["proposed_text"]) + "»" in text
    plain = [s for s in (ev for ev in events if ev["type"] == "schedule.step")
             for x in s["batch"] if x["request_id"] == final.request_id and x["kind"] == "decode"]
    assert f"<b>{len(plain)}</b> other steps found no match" in text
    one = [ev for ev in events if ev["type"] != "spec"] + spec[:1]  # one round: "1 round found", not "1 rounds"
    text = {s.key: s.text for s in journey(model, final.request_id, None, one, outputs)}["spec"]
    assert "<b>1</b> round found a match" in text and "1</b> rounds" not in text
    # token text is escaped
    hostile = [dict(ev, proposed_text=XSS[:1] * ev["k"], ngram=dict(ev["ngram"], text=XSS[1:] * 2))
               if ev["type"] == "spec" else ev for ev in events]
    text = {s.key: s.text for s in journey(model, final.request_id, None, hostile, outputs)}["spec"]
    assert "&lt;img src=x" in text and not re.search(r"<(img|svg|/script|b>x)", text)


def test_the_sampling_panel_says_kept_tokens_were_copied_not_drafted(repeat_trace):
    from visualizers.sampling import sampling_html

    _, events, _, _ = repeat_trace
    samples = [e for e in events if e["type"] == "sample"]
    kept = [i for i, s in enumerate(samples) if s["source"] == "draft"]
    assert kept and all(samples[i]["method"] == "ngram" for i in kept)
    assert all(s["method"] is None for s in samples if s["source"] == "target")
    html = sampling_html(samples, step=kept[0])
    assert "n-gram lookup copied the target" in html and "copied by n-gram lookup" in html
    assert "draft" not in html.replace("tt-chip-draft", "")
