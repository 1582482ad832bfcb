"""Classroom mode's script: the stages of DESIGN.md, each explained in a few sentences
that quote this request's own numbers (read from its trace events), plus which panel
to show beside the words. Pure: events in, escaped HTML out."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from visualizers._html import esc, fmt_bytes, fmt_ms


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
           outputs: Sequence[dict], kv_peak: dict | None = None) -> list[Stage]:
    """kv_peak: the block pool (as kv_grid_html takes it) when this request held the most
    tokens; the KV stage quotes it, so its words and its grid agree."""
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
    out.append(Stage("request", "1 · The request arrives", _p(
        f"A client sent a JSON body like any OpenAI client would: {_n(len(msgs))} message{'s' if len(msgs) != 1 else ''}, {_n(chars)} characters "
        f"of text, asking for at most {_n(params.get('max_tokens', 0))} new tokens at temperature "
        f"{_n(float(params.get('temperature', 0)))}.",
        f"The server checked every field before the engine saw it, and gave the request its id <b>{rid}</b>: every "
        "event below carries that id."), ("request",)))

    # 2. prefix cache
    if look:
        bs = model["block_size"]
        if look["hit"]:
            t2 = (f"The engine hashed the prompt in blocks of {_n(bs)} tokens and found {_n(len(look['cached_blocks']))}"
                  f" of them already in the cache from an earlier request: {_n(look['cached_tokens'])} of "
                  f"{_n(look['prompt_tokens'])} prompt tokens need no prefill at all.")
        else:
            t2 = (f"The engine hashed the prompt's {_n(look.get('full_blocks', 0))} full blocks of {_n(bs)} tokens "
                  "and looked each hash up in the cache: no earlier request began the same way, so every one of the "
                  f"{_n(look['prompt_tokens'])} prompt tokens is computed now (a MISS).")
        out.append(Stage("prefix", "2 · Prefix cache", _p(t2, "A second request with the same system prompt would "
                         "reuse those blocks (a HIT) and skip their prefill."), ("prefix",)))
    else:
        out.append(Stage("prefix", "2 · Prefix cache", _p(NOT_YET, "When the scheduler admits it, the engine looks "
                         "its prompt's blocks up in the prefix cache."), ("prefix",)))

    # 3. tokenize
    if tok:
        special = sum(1 for t in tok["tokens"] if t.get("special"))
        out.append(Stage("tokens", "3 · Tokenize", _p(
            f"The chat template wrapped the messages in role markers, then byte-level BPE cut the text into "
            f"{_n(tok['count'])} tokens, each an integer id in a vocabulary of {_n(tok.get('tokenizer_size') or model['vocab_size'])}."
            f" {_n(special)} of them are special tokens that mark whose turn it is (highlighted).",
            "The model never sees letters: only these ids."), ("tokens",)))
    else:
        out.append(Stage("tokens", "3 · Tokenize", _p(NOT_YET), ("tokens",)))

    # 4. embed
    embeds = ev.get("embed", [])
    rows = sum(e["shape"][0] for e in embeds) if embeds else n_prompt
    out.append(Stage("embedding", "4 · Embed", _p(
        f"Each id picks one row of the embedding matrix ({_n(model['vocab_size'])} rows × {_n(d_model)} numbers). "
        f"The prompt becomes a [{n_prompt:,} × {d_model:,}] matrix: {_n(n_prompt * d_model)} numbers, "
        f"{esc(fmt_bytes(n_prompt * d_model * b))} in {esc(model['dtype'])}.",
        f"Every generated token adds one more row ({_n(rows)} rows went in over this request)."
        if embeds else "This request was traced without tensors, so the rows themselves were not kept."),
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
        moe_text = "Its feed-forward block is one dense SwiGLU MLP per layer."
    out.append(Stage("layers", "5 · Through the layers", _p(
        f"The matrix now passes through {_n(L)} layers. In each, attention lets every token look back at the tokens "
        f"before it: softmax(QKᵀ/√{D})·V with {_n(H)} query heads that share {_n(KVH)} key/value heads "
        f"({group} query heads per KV head: grouped-query attention, so the cache stores {group}× less).",
        moe_text), ("attention", "moe")))

    # 6. prefill vs decode
    mine = [s for s in ev.get("schedule.step", []) if any(x["request_id"] == request_id for x in s["batch"])]
    kinds = [x["kind"] for s in ev.get("schedule.step", []) for x in s["batch"] if x["request_id"] == request_id]
    n_prefill = sum(1 for k in kinds if k == "prefill")
    n_decode = len(kinds) - n_prefill
    ttft = (fin or {}).get("ttft")
    step_ms = [s["forward_seconds"] for s in mine if s.get("forward_seconds") is not None]
    out.append(Stage("timeline", "6 · Prefill, then decode", _p(
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
    out.append(Stage("kv", "7 · The KV cache", _p(
        f"So that no step recomputes the past, each layer's keys and values are kept: 2 × {L} layers × {KVH} KV "
        f"heads × {D} dims × {b} bytes = {_n(per_token)} bytes per token.",
        f"{when}this request held K/V for {_n(tokens)} tokens: {esc(fmt_bytes(per_token * tokens))} in "
        f"{_n(blocks)} blocks of {bs} tokens, taken from a shared pool of {_n(model['num_blocks'])} "
        "blocks and handed back the moment it finished."), ("kv",)))

    # 8. sampling
    samples = ev.get("sample", [])
    if samples:
        s = samples[0]
        p = s.get("params", {})
        knobs = ("greedy: always the most likely token" if p.get("greedy") else
                 f"temperature {p.get('temperature', 1):g}, top-k {p.get('top_k') or 'off'}, top-p {p.get('top_p', 1):g}")
        out.append(Stage("sampling", "8 · Sample", _p(
            f"The last layer's output times the LM head gives one score for each of {_n(model['vocab_size'])} tokens."
            f" Softmax turns them into probabilities; then the knobs cut the list ({esc(knobs)}).",
            f"For the first answer token the engine drew {esc(repr(s.get('token_text', '')))} with probability "
            f"{_n(float(s.get('token_prob', 0)))}; the distribution's entropy was "
            f"{_n(float(s.get('entropy', 0)))} nats. {_n(len(samples))} draws were traced."), ("sampling",)))
    else:
        out.append(Stage("sampling", "8 · Sample", _p(NOT_YET, "Each step ends with logits over the vocabulary, cut "
                         "by temperature, top-k and top-p, and one token drawn."), ("sampling",)))

    # 9. stream
    tokens_ev = ev.get("token", [])
    lat = [t["latency"] for t in tokens_ev[1:] if t.get("latency") is not None]
    out.append(Stage("answer", "9 · Stream", _p(
        f"Each token left as a server-sent event the moment it existed: {_n(n_gen)} tokens.",
        f"Between tokens: {esc(fmt_ms(statistics.median(lat)))} at the median, {esc(fmt_ms(max(lat)))} at most."
        if lat else ""), ("answer",)))

    # 10. stop
    if fin:
        u = fin.get("usage", {})
        why = {"stop": "the model produced an end-of-turn token (or a stop string)",
               "length": "it reached max_tokens", "abort": "it was stopped (a click or a closed connection)"}
        out.append(Stage("finish", "10 · Stop", _p(
            f"It ended because {esc(why.get(fin['reason'], fin['reason']))} (finish_reason "
            f"<b>{esc(fin['reason'])}</b>).",
            f"Usage: {_n(u.get('prompt_tokens', 0))} prompt tokens ({_n(u.get('cached_tokens', 0))} from the prefix "
            f"cache) and {_n(u.get('completion_tokens', 0))} completion tokens.",
            f"It was preempted {_n(fin.get('preemptions', 0))} times."
            if fin.get("preemptions") else ""), ("answer", "request")))
    else:
        out.append(Stage("finish", "10 · Stop", _p(f"Still running: {_n(n_gen)} tokens so far. It will end at an "
                         "end-of-turn token, a stop string or max_tokens."), ("answer", "request")))

    # 11. batching
    shared = [s for s in mine if len(s["batch"]) > 1]
    others = {x["request_id"] for s in mine for x in s["batch"]} - {request_id}
    out.append(Stage("batching", "11 · Continuous batching", _p(
        f"The engine never waits for a batch to fill. Of this request's {_n(len(mine))} steps, {_n(len(shared))} "
        f"were shared with {_n(len(others))} other request{'s' if len(others) != 1 else ''}"
        f" (at most {_n(max((len(s['batch']) for s in mine), default=1))} in one step).",
        "A finishing request frees its slot and blocks at once; a new prefill joins while others decode."),
        ("timeline", "kv")))

    # 12. speculative decoding
    spec = ev.get("spec", [])
    if spec:
        proposed = sum(s["k"] for s in spec)
        accepted = sum(s["accepted"] for s in spec)
        t12 = (f"A small draft model proposed up to {_n(spec[0]['k'])} tokens per round; the target checked them all "
               f"in one forward pass. Over {_n(len(spec))} rounds it proposed {_n(proposed)} and the target kept "
               f"{_n(accepted)} ({accepted / max(1, proposed):.0%}), plus one token of its own each round: "
               f"{(accepted + len(spec)) / len(spec):.2f} tokens per target pass instead of 1.")
    else:
        t12 = ("This request ran without a draft model: one target forward pass per token. With speculation on, a "
               "small draft proposes k tokens and the target verifies them in one pass.")
    out.append(Stage("spec", "12 · Speculative decoding", _p(t12), ("spec",)))

    # 13. beyond one device
    out.append(Stage("parallel", "13 · Beyond one GPU", parallel_html(model), ()))
    return out


def parallel_html(model: dict, devices: int = 2) -> str:
    """How this model would be split across N devices, and what crosses the wire per token."""
    L, H, KVH, d, b = model["num_layers"], model["num_heads"], model["num_kv_heads"], model["hidden_size"], \
        model["dtype_bytes"]
    n = devices
    rows = [f"<b>Tensor parallel × {n}</b>: each device holds {H / n:g} of {H} query heads and {KVH / n:g} of "
            f"{KVH} KV heads per layer (its slice of every weight matrix). After attention and after the MLP the "
            f"partial sums are all-reduced: 2 × {L} layers × {d:,} values × {b} B = "
            f"<b>{esc(fmt_bytes(2 * L * d * b))}</b> per token.",
            f"<b>Pipeline parallel × {n}</b>: each device runs {L / n:g} consecutive layers of {L} "
            f"(device 0: layers 0…{max(0, L // n - 1)}); only the hidden state crosses between stages: {d:,} × {b} B = "
            f"<b>{esc(fmt_bytes(d * b))}</b> per token per boundary."]
    if model.get("is_moe"):
        E, k = int(model.get("num_experts", 0)), int(model.get("top_k", 0))
        rows.append(f"<b>Expert parallel × {n}</b>: {E / n:g} of {E} experts per device; each token's hidden state "
                    f"goes to its {k} experts and back (all-to-all): up to 2 × {k} × {d:,} × {b} B = "
                    f"<b>{esc(fmt_bytes(2 * k * d * b))}</b> per token per MoE layer.")
    return _p(*rows) + "<p class='tt-note'>Figures from this model's config; this engine itself runs on one device.</p>"
