"""Classroom mode's script: the stages of ARCHITECTURE.md's journey, each explained in a few sentences
that quote this request's own numbers (read from its trace events), plus which panel
to show beside the words. Pure: events in, escaped HTML out."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Sequence

from visualizers.parallel import measured_stage_html, parallel_panel_html
from visualizers._html import esc, fmt_bytes, fmt_ms
from visualizers.attention import layer_spans
from visualizers.compact import lens_layers
from visualizers.logit_lens import first_top, logit_lens_html
from visualizers.speculative import span_text, totals


@dataclass(frozen=True)
class Stage:
    key: str
    title: str
    text: str  # HTML, already escaped
    panels: tuple[str, ...]  # the page's panels (app/live_view.PANELS) shown with it; "parallel" is this file's


NOT_YET = "Not reached yet: this request is still on its way (the page re-reads it while it runs)."


def _by_type(events: Sequence[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for e in events:
        out.setdefault(e["type"], []).append(e)
    return out


def _n(x: float) -> str:
    return f"<b>{x:,}</b>" if isinstance(x, int) else f"<b>{x:,.2f}</b>"


def _p(*sentences: str) -> str:
    return "".join(f"<p>{s}</p>" for s in sentences if s)


def stages(model: dict, request_id: str, body: dict | None, events: Sequence[dict],
           outputs: Sequence[dict], kv_peak: dict | None = None, truncated: dict | None = None) -> list[Stage]:
    """kv_peak: the block pool (as kv_grid_html takes it) when this request held the most
    tokens; the KV stage quotes it, so its words and its grid agree. truncated: the trace's
    {"step", "limit_bytes"} when the server's per-request cap stopped its tensor captures."""
    ev = _by_type(events)
    first = lambda t: (ev.get(t) or [None])[0]  # noqa: E731
    arrive, tok, look, fin = first("request.arrive"), first("tokenize"), first("prefix_cache.lookup"), first("finish")
    rid = esc(request_id)
    gen = [o for o in outputs if o.get("token_id", -1) >= 0]
    n_prompt = tok["count"] if tok else (look or {}).get("prompt_tokens", 0)
    n_gen = len(gen) or (fin or {}).get("usage", {}).get("completion_tokens", 0)
    L, H, KVH, D = model["num_layers"], model["num_heads"], model["num_kv_heads"], model["head_dim"]
    d_model, b = model["hidden_size"], model["dtype_bytes"]
    out: list[Stage] = []

    # 1. the request
    msgs = (arrive or {}).get("messages") or (body or {}).get("messages") or []
    params = (arrive or {}).get("params", {})
    chars = sum(len(m.get("content", "")) for m in msgs if isinstance(m, dict))
    out.append(Stage("request", "The request arrives", _p(
        f"A client sent a JSON body like any OpenAI client would: {_n(len(msgs))} message{'s' if len(msgs) != 1 else ''}, {_n(chars)} characters "
        f"of text, asking for at most {_n(params.get('max_tokens', 0))} new tokens at temperature "
        f"{_n(float(params.get('temperature', 0)))}.",
        f"The server checked every field before the engine saw it, and gave the request its id <b>{rid}</b>: every "
        "event below carries that id."), ("request",)))

    # 2. prefix cache
    if look:
        bs = model["block_size"]
        out.append(Stage("prefix", "Prefix cache", _prefix_text(look, model["block_size"]), ("prefix",)))
    else:
        out.append(Stage("prefix", "Prefix cache", _p(NOT_YET, "When the scheduler admits it, the engine looks "
                         "its prompt's blocks up in the prefix cache."), ("prefix",)))

    # 3. tokenize
    if tok:
        special = sum(1 for t in tok["tokens"] if t.get("special"))
        out.append(Stage("tokens", "Tokenize", _p(
            f"The chat template wrapped the messages in role markers, then byte-level BPE cut the text into "
            f"{_n(tok['count'])} tokens, each an integer id in a vocabulary of {_n(tok.get('tokenizer_size') or model['vocab_size'])}."
            f" {_n(special)} of them are special tokens that mark whose turn it is (highlighted).",
            "The model never sees letters: only these ids."), ("tokens",)))
    else:
        out.append(Stage("tokens", "Tokenize", _p(NOT_YET), ("tokens",)))

    # 4. embed
    cut = (f"The trace reached the server's size cap at engine step {_n(int(truncated['step']))}: the tensor "
           "captures (embedding rows, attention, MoE routing) stop there, so the panels show the steps before it."
           if truncated else "")
    out.append(Stage("embedding", "Embed", _p(
        f"Each id picks one row of the embedding matrix ({_n(model['vocab_size'])} rows × {_n(d_model)} numbers). "
        f"This request's prompt is {_n(n_prompt)} tokens: a [{n_prompt:,} × {d_model:,}] matrix, "
        f"{_n(n_prompt * d_model)} numbers, {esc(fmt_bytes(n_prompt * d_model * b))} in {esc(model['dtype'])}.",
        *_embed_lookups(ev.get("embed", []), n_prompt, (look or {}).get("cached_tokens", 0), d_model,
                        bool(ev.get("spec")), bool((fin or {}).get("preemptions"))), cut),
        ("embedding",)))

    # 5. layers: attention and MoE
    group = H // max(1, KVH)
    moe = ev.get("moe", [])
    moe_text = ""
    if model.get("is_moe") and moe:
        e0 = [m for m in moe if m["layer"] == moe[0]["layer"]]
        counts = [0] * int(model.get("num_experts") or moe[0]["num_experts"])
        for m in e0:
            for picks in m["experts"]:
                for x in picks:
                    counts[int(x)] += 1
        total = sum(counts) or 1
        top = max(range(len(counts)), key=counts.__getitem__)
        moe_text = (f"In layer {moe[0]['layer']} the router sent each of this request's tokens to "
                    f"{_n(moe[0]['top_k'])} of {_n(len(counts))} experts; expert {top} took the most, "
                    f"{_n(counts[top])} of {_n(total)} picks ({counts[top] / total:.0%}).")
    elif model.get("is_moe"):
        moe_text = f"Its feed-forward layers are mixtures of {_n(model.get('num_experts', 0))} experts."
    else:
        glu = "GeGLU" if str(model.get("mlp_activation", "silu")).startswith("gelu") else "SwiGLU"
        moe_text = f"Its feed-forward block is one dense {glu} MLP per layer."
    scale_d = model.get("query_pre_attn_scalar") or D  # Gemma scales by 1/√query_pre_attn_scalar
    out.append(Stage("layers", "Through the layers", _p(
        f"The matrix now passes through {_n(L)} layers. In each, attention lets every token look back at the tokens "
        f"before it: softmax(QKᵀ/√{scale_d:g})·V with {_n(H)} query heads that share {_n(KVH)} key/value heads "
        f"({group} query heads per KV head: grouped-query attention, so the cache stores {group}× less).",
        _window_text(model.get("sliding_windows") or []), moe_text, cut), ("attention", "moe")))

    # 6. prefill vs decode
    mine = [s for s in ev.get("schedule.step", []) if any(x["request_id"] == request_id for x in s["batch"])]
    kinds = [x["kind"] for s in ev.get("schedule.step", []) for x in s["batch"] if x["request_id"] == request_id]
    n_prefill = sum(1 for k in kinds if k == "prefill")
    n_decode = len(kinds) - n_prefill
    ttft = (fin or {}).get("ttft")
    step_ms = [s["forward_seconds"] for s in mine if s.get("forward_seconds") is not None]
    out.append(Stage("timeline", "Prefill, then decode", _p(
        f"Prefill ran the whole prompt through the model in {_n(n_prefill)} forward pass"
        f"{'es' if n_prefill != 1 else ''} (long prompts are cut into chunks that share steps with other "
        f"requests); then {_n(n_decode)} decode or verify steps produced the answer.",
        (f"Time to first token: <b>{esc(fmt_ms(ttft))}</b>. " if ttft is not None else "")
        + (f"A forward pass took {esc(fmt_ms(statistics.median(step_ms)))} at the median." if step_ms else "")),
        ("timeline",)))

    # 7. KV cache
    per_token = 2 * L * KVH * D * b
    bs = model["block_size"]
    if kv_peak is not None:
        held = [blk for blk, rids in kv_peak["owners"].items() if request_id in rids]
        tokens, blocks = sum(kv_peak["fill"].get(blk, 0) for blk in held), len(held)
        when = f"After engine step {kv_peak['step']}, the last before it finished, "
    else:  # the last token drawn is never fed back, so it has no K/V
        tokens, blocks, when = max(0, n_prompt + n_gen - 1), -(-max(0, n_prompt + n_gen - 1) // bs), "At its end "
    out.append(Stage("kv", "The KV cache", _p(
        f"So that no step recomputes the past, each layer's keys and values are kept: 2 × {L} layers × {KVH} KV "
        f"heads × {D} dims × {b} bytes = {_n(per_token)} bytes per token.",
        f"{when}this request held K/V for {_n(tokens)} tokens: {esc(fmt_bytes(per_token * tokens))} in "
        f"{_n(blocks)} blocks of {bs} tokens, taken from a shared pool of {_n(model['num_blocks'])} "
        "blocks and handed back the moment it finished."), ("kv",)))

    # between the layers and sampling: the logit lens
    # its own grid, of the first answer token (the page's panel follows the newest, often an end-of-turn token)
    lens = ev.get("logit_lens", [])
    out.append(Stage("logit_lens", "The logit lens", _lens_text(lens, L)
                     + (logit_lens_html(lens, lens[0]["position"]) if lens else ""), ()))

    # 8. sampling
    samples = ev.get("sample", [])
    if samples:
        s = samples[0]
        p = s.get("params", {})
        knobs = ("greedy: always the most likely token" if p.get("greedy") else
                 f"temperature {p.get('temperature', 1):g}, top-k {p.get('top_k') or 'off'}, top-p {p.get('top_p', 1):g}")
        out.append(Stage("sampling", "Sample", _p(
            f"The last layer's output times the LM head gives one score for each of {_n(model['vocab_size'])} tokens."
            f" Softmax turns them into probabilities; then the knobs cut the list ({esc(knobs)}).",
            f"For the first answer token the engine drew {esc(repr(s.get('token_text', '')))} with probability "
            f"{_n(float(s.get('token_prob', 0)))}; the distribution's entropy was "
            f"{_n(float(s.get('entropy', 0)))} nats. {_n(len(samples))} draws were traced."), ("sampling",)))
    else:
        out.append(Stage("sampling", "Sample", _p(NOT_YET, "Each step ends with logits over the vocabulary, cut "
                         "by temperature, top-k and top-p, and one token drawn."), ("sampling",)))

    # 9. stream
    out.append(Stage("answer", "Stream", _p(
        f"Each token left as a server-sent event the moment it existed: {_n(n_gen)} tokens.",
        _stream_timing(ev.get("token", []))), ("answer",)))

    # 10. stop
    if fin:
        u = fin.get("usage", {})
        why = {"stop": "the model produced an end-of-turn token (or a stop string)",
               "length": "it reached max_tokens", "abort": "it was stopped (a click or a closed connection)"}
        out.append(Stage("finish", "Stop", _p(
            f"It ended because {esc(why.get(fin['reason'], fin['reason']))} (finish_reason "
            f"<b>{esc(fin['reason'])}</b>).",
            f"Usage: {_n(u.get('prompt_tokens', 0))} prompt tokens ({_n(u.get('cached_tokens', 0))} from the prefix "
            f"cache) and {_n(u.get('completion_tokens', 0))} completion tokens.",
            f"It was preempted {_n(fin.get('preemptions', 0))} times."
            if fin.get("preemptions") else ""), ("answer", "request")))
    else:
        out.append(Stage("finish", "Stop", _p(f"Still running: {_n(n_gen)} tokens so far. It will end at an "
                         "end-of-turn token, a stop string or max_tokens."), ("answer", "request")))

    # 11. batching
    shared = [s for s in mine if len(s["batch"]) > 1]
    others = {x["request_id"] for s in mine for x in s["batch"]} - {request_id}
    out.append(Stage("batching", "Continuous batching", _p(
        f"The engine never waits for a batch to fill. Of this request's {_n(len(mine))} steps, {_n(len(shared))} "
        f"were shared with {_n(len(others))} other request{'s' if len(others) != 1 else ''}"
        f" (at most {_n(max((len(s['batch']) for s in mine), default=1))} in one step).",
        "A finishing request frees its slot and blocks at once; a new prefill joins while others decode."),
        ("timeline", "kv")))

    # 12. speculative decoding
    spec = ev.get("spec", [])
    if spec and spec[0].get("method") == "ngram":
        t12 = _ngram_text(spec, kinds.count("decode"))
    elif spec:
        t = totals(spec)  # only the tokens the answer kept
        proposed, accepted = t.proposed, t.accepted
        own = ("one token of its own each round" if t.own == len(spec) else
               f"{_n(t.own)} of its own (none in the round that ended the answer)")
        t12 = (f"A small draft model proposed up to {_n(max(s['k'] for s in spec))} tokens per round; the target "
               f"checked them all in one forward pass. Over {_n(len(spec))} {'round' if len(spec) == 1 else 'rounds'} "
               f"it proposed {_n(proposed)} and the target kept {_n(accepted)} ({accepted / max(1, proposed):.0%}), "
               f"plus {own}: {t.per_pass:.2f} tokens per target pass instead of 1.")
    else:
        t12 = ("This request ran without a draft model: one target forward pass per token. With speculation on, a "
               "small draft proposes k tokens and the target verifies them in one pass.")
    out.append(Stage("spec", "Speculative decoding", _p(t12), ("spec",)))

    # 13. beyond one device
    sharded = [c for c in ev.get("schedule.collective", [])
               if any(x.get("request_id") == request_id for x in c.get("batch", []))]
    measured = measured_stage_html(sharded) + (parallel_panel_html(sharded, L, notes=False) if sharded else "")
    out.append(Stage("parallel", "Beyond one GPU", measured + parallel_html(model, sharded=bool(sharded)), ()))
    # numbered here, so a stage added anywhere renumbers the rest
    return [replace(st, title=f"{i} · {st.title}") for i, st in enumerate(out, 1)]


def _after(row: int) -> str:
    """A logit-lens row as words: row 0 is the embedding, row i the output of layer i - 1."""
    return "right after the embedding" if row == 0 else f"after layer <b>{row - 1}</b>"


def _lens_text(lens: Sequence[dict], num_layers: int) -> str:
    """At which layer does the model already know the answer? Read from the first answer
    token's logit lens, then over every traced token."""
    what = ("Put the residual stream after the embedding and after every layer through the model's final norm "
            "and LM head, and it says what the model would answer if it stopped there.")
    if not lens:
        return _p(what, "This request has no logit lens: capture level full records one per generated token.")
    e = lens[0]
    rows = lens_layers(e)
    top = first_top(rows)
    n = len(rows)
    tok = esc(repr(e["token_text"]))
    if top is None:
        when = f"the drawn token {tok} was never the top candidate (sampling picked a less likely one)"
    elif top == n - 1:
        when = f"{tok} became the top candidate only at the output, after the last layer"
    else:
        when = f"{tok} was already the top candidate {_after(top)}, and stayed there"
    near = next((i for i, r in enumerate(rows) if r["chosen_rank"] <= 10), None)
    near_text = (f" It entered the top 10 {_after(near)} (the embedding alone ranked it "
                 f"{_n(rows[0]['chosen_rank'])})." if near not in (None, n - 1) else
                 f" The embedding alone ranked it {_n(rows[0]['chosen_rank'])}.")
    tops = [first_top(lens_layers(x)) for x in lens]
    early = [t for t, x in zip(tops, lens) if t is not None and t < len(lens_layers(x)) - 1]
    summary = (f"Over the {_n(len(lens))} traced tokens, {_n(len(early))} were settled before the last layer"
               + (f" (at the median, {_after(int(statistics.median(early)))})" if early else "") + ".")
    return _p(what, f"For the first answer token, {when}.{near_text}", summary,
              f"The whole lens is one [{num_layers + 1} × hidden] · [hidden × vocab] product per traced token.")


def _prefix_text(look: dict, bs: int) -> str:
    """Stage 2 for a hit or a miss, in the words of what happened to this request."""
    n, cached, full = look["prompt_tokens"], look.get("cached_tokens", 0), look.get("full_blocks", 0)
    if look["hit"]:
        rest = n - cached
        return _p(f"A <b>HIT</b>. The engine hashed the prompt in blocks of {_n(bs)} tokens and found "
                  f"{_n(len(look['cached_blocks']))} of them already in the cache, left by an earlier request that "
                  f"began the same way (a shared system prompt, or the same conversation so far): {_n(cached)} of the "
                  f"{_n(n)} prompt tokens reuse those K/V blocks and skip prefill; only the other {_n(rest)} "
                  f"{'is' if rest == 1 else 'are'} computed now.",
                  "The blocks are shared, not copied: each one's reference count went up by one, and it stays in "
                  "the pool for as long as any request holds it.")
    if not full:
        return _p(f"A <b>MISS</b>, with nothing to look up: only full blocks of {_n(bs)} tokens are cached (and "
                  f"never a prompt's last token), and this prompt's {_n(n)} tokens do not fill one, so every one is "
                  "computed now.")
    return _p(f"A <b>MISS</b>. The engine hashed the prompt's {_n(full)} full block{'s' if full != 1 else ''} of "
              f"{_n(bs)} tokens and looked each hash up: none was in the cache (no earlier request began the same "
              f"way, or its blocks have been evicted since), so all {_n(n)} prompt tokens are computed now.",
              f"Those blocks stay in the cache after this request ends: a later request that begins with the same "
              f"{_n(full * bs)} tokens (the same system prompt) will find them, a HIT that skips their prefill.")


def _embed_lookups(embeds: Sequence[dict], n_prompt: int, cached: int, d_model: int, spec: bool,
                   preempted: bool) -> list[str]:
    """Stage 4: which rows the panel shows (one per position looked up) and how many went in."""
    if not embeds:
        return ["This request was traced without tensors, so the rows themselves were not kept."]
    seen: dict[int, int] = {}
    for e in embeds:
        for i in range(len(e["token_ids"])):
            seen[e["start"] + i] = seen.get(e["start"] + i, 0) + 1
    shown, total = len(seen), sum(seen.values())
    in_prompt = sum(1 for pos in seen if pos < n_prompt)
    skipped = (f" (the first {_n(cached)} came from the prefix cache, stage 2: their rows were not looked up "
               "again)" if cached else "")
    fed = ("each generated token is looked up when it goes back in as the next step's input, and a verify pass "
           "also looks up the draft's proposals" if spec else
           "each generated token is looked up when it goes back in as the next step's input")
    words = [f"The panel shows the rows this request looked up, one per position: [{shown:,} × {d_model:,}], that "
             f"is {_n(in_prompt)} of the {_n(n_prompt)} prompt positions{skipped} and {_n(shown - in_prompt)} "
             f"after the prompt ({fed})."]
    if total > shown:
        why = [w for w, on in (("a rejected proposal's position is looked up again with the token the target "
                                "chose", spec), ("a preempted request recomputes its tokens", preempted)) if on]
        words.append(f"Counting every forward pass, {_n(total)} rows went in: {_n(total - shown)} lookups were of a "
                     f"position already looked up{' (' + '; '.join(why) + ')' if why else ''}.")
    return words


def _stream_timing(tokens: Sequence[dict]) -> str:
    """Stage 9's gaps: between tokens, or, when a step releases several (speculative rounds),
    between those bursts (the tokens inside one leave together, microseconds apart)."""
    bursts: list[list[dict]] = []
    for t in tokens:
        if bursts and bursts[-1][0]["step"] == t["step"]:
            bursts[-1].append(t)
        else:
            bursts.append([t])
    if len(bursts) == len(tokens):
        lat = [t["latency"] for t in tokens[1:] if t.get("latency") is not None]
        return (f"Between tokens: {esc(fmt_ms(statistics.median(lat)))} at the median, {esc(fmt_ms(max(lat)))} at "
                "most." if lat else "")
    gaps = [b[0]["latency"] for b in bursts[1:] if b[0].get("latency") is not None]
    sizes = [len(b) for b in bursts]
    return (f"They left in bursts: a verify step releases every token it kept at once, so the {_n(len(tokens))} "
            f"tokens came in {_n(len(bursts))} bursts, {len(tokens) / len(bursts):.1f} tokens per burst on average "
            f"(at most {max(sizes)}). Inside a burst the tokens are microseconds apart; between bursts: "
            + (f"{esc(fmt_ms(statistics.median(gaps)))} at the median, {esc(fmt_ms(max(gaps)))} at most."
               if gaps else "none yet."))


def _ngram_text(spec: list[dict], plain_steps: int) -> str:
    """Stage 12 when the proposals came from n-gram lookup, with one round as the example."""
    t = totals(spec)  # only the tokens the answer kept
    proposed, accepted = t.proposed, t.accepted
    look = spec[0].get("lookup", {})
    best = max(spec, key=lambda s: s["accepted"])
    gram, src, p = best["ngram"], best["copied_from"], best["prompt_tokens"]
    quote = lambda texts: f"«{esc(''.join(texts))}»"  # noqa: E731
    return _p(
        "No draft model here: <b>n-gram lookup</b> (prompt lookup). Before each step the engine took the last n tokens "
        f"of prompt + answer, n from {_n(look.get('max_n', gram['n']))} down to {_n(look.get('min_n', gram['n']))}, "
        "found their latest earlier occurrence, and proposed the tokens that followed it there. An answer that "
        "repeats its prompt (or itself) gets many tokens per pass for the price of a search.",
        f"{_n(len(spec))} {'round' if len(spec) == 1 else 'rounds'} found a match and proposed {_n(proposed)} "
        f"tokens; the target kept {_n(accepted)} ({accepted / max(1, proposed):.0%}), plus "
        + ("one token of its own each round" if t.own == len(spec) else
           f"{_n(t.own)} of its own (none in the round that ended the answer)")
        + f": {t.per_pass:.2f} tokens per target pass instead of 1. "
        f"{_n(plain_steps)} other steps found no match (or were at the end) and decoded one token plainly.",
        f"For example, the {gram['n']} tokens {quote(gram['text'])} had occurred before at "
        f"{esc(span_text(gram['start'], gram['start'] + gram['n'] - 1, p))}, so the engine copied "
        f"{quote(best['proposed_text'])} from {esc(span_text(src[0], src[-1], p))}; the target kept "
        f"{_n(best['accepted'])} of those {_n(best['k'])}.",
        "A copy is certain (its q is 1): greedy keeps it when it is the target's top token; sampling keeps it with "
        "probability p, the target's, and after a rejection draws from p without that token, so the answer still "
        "follows the target's distribution.")


def _window_text(windows: Sequence[int | None]) -> str:
    """Which layers attend through a sliding window (local) and which see everything (global)."""
    local = [i for i, w in enumerate(windows) if w]
    if not local:
        return ""
    sizes = sorted({windows[i] for i in local})
    size = " or ".join(f"{w:,}" for w in sizes)
    if len(local) == len(windows):
        return (f"Every layer is local: a token sees only the last <b>{size}</b> tokens (a sliding window), so "
                "information from further back reaches it only through earlier tokens, layer by layer.")
    glob = [i for i, w in enumerate(windows) if not w]
    return (f"{_n(len(local))} of the {len(windows)} layers are local: a token sees only the last <b>{size}</b> "
            f"tokens (a sliding window; layer{'s' if len(local) > 1 else ''} {esc(layer_spans(local))}). The other {_n(len(glob))} are global "
            f"(layer{'s' if len(glob) > 1 else ''} {esc(layer_spans(glob))}) and attend to the whole context, "
            "so long-range information still flows.")


def _smallest_split(n: int) -> int:
    """The smallest number of devices (at least 2) that divides n evenly (n itself when prime)."""
    return next((d for d in range(2, n + 1) if n % d == 0), max(2, n))


def _either(options: list[int]) -> str:
    """[2, 4, 8] -> "2, 4 or 8"."""
    words = [str(o) for o in options]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def parallel_html(model: dict, sharded: bool = False) -> str:
    """How this model would be split across devices, and what crosses the wire per token.
    Heads are never cut in pieces: tensor parallelism needs N to divide the KV heads, and
    each KV head takes its query heads along."""
    L, H, KVH, d, b = model["num_layers"], model["num_heads"], model["num_kv_heads"], model["hidden_size"], \
        model["dtype_bytes"]
    group = H // max(1, KVH)
    splits = [n for n in range(2, KVH + 1) if KVH % n == 0]
    if splits:
        n = splits[0]
        heads = f"{group} query head{'s' if group != 1 else ''}"
        tp = (f"<b>Tensor parallel</b>: a head is never cut in pieces, and a query head reads only its own KV head's "
              f"cache, so the {heads} of each KV head must sit on the device that holds it. N devices must "
              f"therefore divide the {KVH} KV heads: N = {_either(splits)} for this model. With N = {n} each device holds {H // n} of the {H} "
              f"query heads and {KVH // n} of the {KVH} KV heads per layer (its slice of every weight matrix)."
              + (f" N = 2 does not work: {KVH} KV heads do not split in two." if KVH % 2 else ""))
    elif H < 2:
        tp = "<b>Tensor parallel</b>: with a single attention head only the weight matrices' other dimension can split."
    else:  # one KV head (multi-query attention): it cannot be split, only copied
        n = _smallest_split(H)
        tp = (f"<b>Tensor parallel</b>: this model's {H} query heads share a single KV head, which cannot be split: "
              f"N devices split the query heads (N must divide {H}: with N = {n}, {H // n} each) and each device "
              "keeps a copy of the KV head, so its cache is stored N times.")
    tp += (f" After attention and after the MLP the partial sums are all-reduced: 2 × {L} layers × {d:,} values × "
           f"{b} B = <b>{esc(fmt_bytes(2 * L * d * b))}</b> per token, whatever N.")
    first = (L + 1) // 2
    pp = (f"<b>Pipeline parallel × 2</b>: each device runs consecutive layers, {first} and {L - first} of {L} (device "
          f"0: layers 0…{max(0, first - 1)}, device 1: layers {first}…{L - 1}); only the hidden state crosses "
          f"between stages: {d:,} × {b} B = <b>{esc(fmt_bytes(d * b))}</b> per token per boundary."
          if L >= 2 else f"<b>Pipeline parallel</b>: with {L} layer there is nothing to split between devices.")
    rows = [tp, pp]
    if model.get("is_moe"):
        E, k = int(model.get("num_experts", 0)), int(model.get("top_k", 0))
        if E >= 2:
            m = _smallest_split(E)
            rows.append(f"<b>Expert parallel × {m}</b>: {E // m} of {E} experts per device (whole experts, never "
                        f"halves); each token's hidden state goes to its {k} experts and back (all-to-all): up to "
                        f"2 × {k} × {d:,} × {b} B = <b>{esc(fmt_bytes(2 * k * d * b))}</b> per token per MoE layer."
                        + (" This engine instead keeps every token on every rank (attention's all-reduce already "
                           "put it there) and sums the experts' partial outputs in the block's one all-reduce "
                           f"({d:,} × {b} B per token)." if sharded else ""))
    note = "Figures from this model's config." + ("" if sharded else " This request ran on one device "
                                                    "(--tensor-parallel-size 2 splits it).")
    return _p(*rows) + f"<p class='tt-note'>{note} Pipeline parallelism is not built in this engine.</p>"
