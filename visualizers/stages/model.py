"""Inside the model: the layers, prefill then decode, the KV pages, the LM head and its lens."""
from __future__ import annotations

import statistics
from typing import Sequence

from visualizers.compact import lens_layers
from visualizers import i18n
from visualizers._html import esc, fmt_bytes, fmt_ms
from visualizers.attention import layer_spans
from visualizers.logit_lens import first_top
from visualizers.own_times import own_times
from visualizers.stages.deepseek import deepseek_ffn, mla_heads, mla_kv
from visualizers.stages.facts import (Facts, Part, before_cut, count, hidden_sentence, n, p, plural, quote, said,
                                      said_before_cut, said_n)
from visualizers.stages.way_in import cut_sentence, not_yet, untraced_words


def _heads(f: Facts, m: dict) -> str:
    """How the heads attend: MLA, multi-query, plain multi-head, or grouped-query."""
    H, KVH = m["num_heads"], m["num_kv_heads"]
    group = H // max(1, KVH)
    if (mla := mla_heads(f, m)) is not None:  # DeepSeek: multi-head latent attention
        return mla
    if KVH == 1:
        return said_n(f, "{n} query head that share a single key/value head (multi-query attention: the cache stores "
                         "one head's K/V, {times}× less)",
                      "{n} query heads that share a single key/value head (multi-query attention: the cache stores "
                      "one head's K/V, {times}× less)", H, times=str(H))
    if group == 1:
        return said_n(f, "{n} head, each with its own keys and values (plain multi-head attention)",
                      "{n} heads, each with its own keys and values (plain multi-head attention)", H)
    kv_heads = said_n(f, "{n} key/value head", "{n} key/value heads", KVH)
    return said_n(f, "{n} query head that share {kv} ({group} query heads per KV head: grouped-query attention, so the "
                     "cache stores {group}× less)",
                  "{n} query heads that share {kv} ({group} query heads per KV head: grouped-query attention, so the "
                  "cache stores {group}× less)", H, kv=kv_heads, group=str(group))


def layers(f: Facts) -> Part:
    m = f.model
    L, D = m["num_layers"], m["head_dim"]
    scale = format(m.get("query_pre_attn_scalar") or D, "g")  # Gemma scales by 1/√query_pre_attn_scalar
    heads = _heads(f, m)
    reached = bool(f.steps or f.generated)
    passes = (said_n(f, "The matrix now passes through {n} layer. In each, attention lets every token look back at the "
                        "tokens before it: softmax(QKᵀ/√{scale})·V with {heads}.",
                     "The matrix now passes through {n} layers. In each, attention lets every token look back at the "
                     "tokens before it: softmax(QKᵀ/√{scale})·V with {heads}.", L, scale=scale, heads=heads)
              if reached else
              said_n(f, "The matrix passes through {n} layer. In each, attention lets every token look back at the "
                        "tokens before it: softmax(QKᵀ/√{scale})·V with {heads}.",
                     "The matrix passes through {n} layers. In each, attention lets every token look back at the "
                     "tokens before it: softmax(QKᵀ/√{scale})·V with {heads}.", L, scale=scale, heads=heads))
    text = p("" if reached or f.idle else not_yet(f), passes, _windows(f, m.get("sliding_windows") or []), _ffn(f),
             deepseek_ffn(f, m, f.moe_first_layer) or "", cut_sentence(f))
    # a dense model's section shows no MoE panel: there is nothing to route
    chip = esc(i18n.gettext(f.lang, "{layers} layers", layers=i18n.number(f.lang, L)))
    return Part(text, ("attention", "moe") if m.get("is_moe") else ("attention",), chip, reached=reached)


def _ffn(f: Facts) -> str:
    m, moe = f.model, f.moe_first_layer
    if m.get("is_moe") and moe:
        counts = [0] * int(m.get("num_experts") or moe[0]["num_experts"])
        for ev in moe:
            for picks in ev["experts"]:
                for x in picks:
                    counts[int(x)] += 1
        total = sum(counts) or 1
        top = max(range(len(counts)), key=counts.__getitem__)
        return said(f, "In layer {layer} the router sent each of this request's tokens to {k} of {experts} experts; "
                       "expert {top} took the most, {count} of {total} picks ({share}).", layer=str(moe[0]["layer"]),
                    k=n(int(moe[0]["top_k"])), experts=n(len(counts)), top=str(top), count=n(counts[top]),
                    total=n(total), share=format(counts[top] / total, ".0%"))
    if m.get("is_moe"):
        return said(f, "Its feed-forward layers are mixtures of {experts} experts.",
                    experts=n(int(m.get("num_experts") or 0)))
    glu = "GeGLU" if str(m.get("mlp_activation", "silu")).startswith("gelu") else "SwiGLU"
    return said(f, "Its feed-forward block is one dense {glu} MLP per layer (no mixture of experts: nothing to route).",
                glu=glu)


def _windows(f: Facts, windows: Sequence[int | None]) -> str:
    """Which layers attend through a sliding window (local) and which see everything (global)."""
    local = [i for i, w in enumerate(windows) if w]
    if not local:
        return ""
    size = "<b>" + said(f, " or ").join(f"{w:,}" for w in sorted({windows[i] for i in local})) + "</b>"
    if len(local) == len(windows):
        return said(f, "Every layer is local: a token sees only the last {size} tokens (a sliding window), so "
                       "information from further back reaches it only through earlier tokens, layer by layer.",
                    size=size)
    glob = [i for i, w in enumerate(windows) if not w]
    first = said_n(f, "{n} of the {total} layers are local: a token sees only the last {size} tokens (a sliding window; "
                      "layer {spans}).",
                   "{n} of the {total} layers are local: a token sees only the last {size} tokens (a sliding window; "
                   "layers {spans}).", len(local), total=str(len(windows)), size=size, spans=esc(layer_spans(local)))
    other = said_n(f, "The other {n} is global (layer {spans}) and attend to the whole context, so long-range "
                      "information still flows.",
                   "The other {n} are global (layers {spans}) and attend to the whole context, so long-range "
                   "information still flows.", len(glob), spans=esc(layer_spans(glob)))
    return i18n.sentences(f.lang, first, other)


def prefill_decode(f: Facts) -> Part:
    if f.untraced:
        return Part(p(untraced_words(f), said(f, "Prefill ran the prompt through the model; then each decode step produced a "
                                        "token (the stream's timing shows them).")), ("timeline",))
    if not f.steps:
        return Part(p(not_yet(f), said(f, "Prefill runs the prompt through the model; then each decode step produces "
                                          "a token.")), ("timeline",), reached=bool(f.generated))
    fin = f.finish or {}
    ttft = fin.get("ttft")
    if ttft is None and f.generated:  # mid-stream or mid-replay: the first token's own time since arrival is it
        ttft = f.generated[0].get("t")
    step_ms = [s["forward_seconds"] for s in f.steps if s.get("forward_seconds") is not None]
    own = own_times(fin)
    timing = ((said(f, "Time to first token: {ttft}.", ttft="<b>" + esc(fmt_ms(ttft)) + "</b>")
               + i18n.GAP.get(f.lang, " ") if ttft is not None else "")
              + (said(f, "The engine's own was {own}: tracing this request added {added}.", own=esc(fmt_ms(own.ttft)),
                      added=esc(fmt_ms(own.ttft_added))) + i18n.GAP.get(f.lang, " ") if own is not None else "")
              + (said(f, "A forward pass took {time} at the median.", time=esc(fmt_ms(statistics.median(step_ms))))
                 if step_ms else ""))
    chip = (i18n.gettext(f.lang, "TTFT {time}", time=fmt_ms(ttft)) if ttft is not None else
            i18n.ngettext(f.lang, "{n} step", "{n} steps", len(f.steps)))
    return Part(p(_passes(f), timing), ("timeline",), esc(chip))


def _passes(f: Facts) -> str:
    """How the prompt was prefilled (in how many passes), and the decode (and verify) steps after it."""
    n_prefill, n_verify = f.kinds.count("prefill"), f.kinds.count("verify")
    n_decode = len(f.kinds) - n_prefill - n_verify
    # verify steps only where a draft proposed tokens: a request with no draft has decode steps alone
    later = (said_n(f, "{decode} decode and {n} verify step", "{decode} decode and {n} verify steps", n_verify,
                    decode=n(n_decode)) if n_verify else said_n(f, "{n} decode step", "{n} decode steps", n_decode))
    total, cached = f.n_prompt, f.cached_tokens
    what = (said_n(f, "the {n} prompt token not found in the prefix cache ({cached} of the {total} came from it)",
                   "the {n} prompt tokens not found in the prefix cache ({cached} of the {total} came from it)",
                   total - cached, cached=n(cached), total=n(total)) if cached else
            said_n(f, "the whole prompt ({n} token)", "the whole prompt ({n} tokens)", total))
    values = {"what": what, "later": later}
    if f.hidden_from is not None:
        return said_n(f, "Prefill ran {what} through the model in {n} forward pass (long prompts are cut into chunks that "
                         "share steps with other requests); then {later} ran {before} (the later ones are not shown).",
                      "Prefill ran {what} through the model in {n} forward passes (long prompts are cut into chunks "
                      "that share steps with other requests); then {later} ran {before} (the later ones are not "
                      "shown).", n_prefill, before=said_before_cut(f), **values)
    if f.finish:
        return said_n(f, "Prefill ran {what} through the model in {n} forward pass (long prompts are cut into chunks that "
                         "share steps with other requests); then {later} produced the answer.",
                      "Prefill ran {what} through the model in {n} forward passes (long prompts are cut into chunks "
                      "that share steps with other requests); then {later} produced the answer.", n_prefill, **values)
    return said_n(f, "Prefill ran {what} through the model in {n} forward pass (long prompts are cut into chunks that "
                     "share steps with other requests); then {later} produced the answer so far.",
                  "Prefill ran {what} through the model in {n} forward passes (long prompts are cut into chunks that "
                  "share steps with other requests); then {later} produced the answer so far.", n_prefill, **values)


def _held_when(f: Facts) -> str:
    """When the K/V held is counted: after an engine step (which one), at the end, or so far."""
    peak = f.kv_peak
    if f.idle:
        return ""
    if peak is None:
        return said(f, "At its end ") if f.finish else said(f, "So far ")
    step = str(peak["step"])
    if f.hidden_from is not None:
        if f.cut is not None and f.cut.get("drawn_at") == peak["step"]:  # a prefill or plain decode step
            return said(f, "After engine step {step}, the one that drew the hidden token (whose own K/V the step after "
                           "it would write), ", step=step)
        return said(f, "After engine step {step}, the last before the hidden token was drawn, ", step=step)
    if f.finish:
        return said(f, "After engine step {step}, the last before it finished, ", step=step)
    return said(f, "After engine step {step}, ", step=step)


def kv(f: Facts) -> Part:
    m = f.model
    L, KVH, D, b, bs = m["num_layers"], m["num_kv_heads"], m["head_dim"], m["dtype_bytes"], m["block_size"]
    per_token = 2 * L * KVH * D * b
    peak = f.kv_peak
    if peak is not None:
        held = [blk for blk, rids in peak["owners"].items() if f.request_id in rids]
        tokens, blocks = sum(peak["fill"].get(blk, 0) for blk in held), len(held)
    else:  # the last token drawn is never fed back, so it has no K/V
        tokens = max(0, f.n_prompt + f.n_gen - 1)
        blocks = -(-tokens // bs)
    when = _held_when(f)
    kept = said(f, "So that no step recomputes the past, each layer's keys and values are kept: {bytes} bytes per "
                   "token.", bytes=n(per_token))
    if peak is None and not f.finish and not f.steps and not f.generated and not f.idle and not f.untraced:
        return Part(p(kept, not_yet(f)), ("kv",), reached=False)  # waiting: no block held yet
    if peak is None and f.finish and not f.n_gen:  # stopped before its first token: no step ran it
        return Part(p(kept, said(f, "It was stopped during its prefill, before its first token: its blocks went back "
                                    "to the pool.") if f.steps else
                      said(f, "Never reached: this request ended before the engine ran it, so it never held K/V.")),
                    ("kv",), esc(i18n.gettext(f.lang, "none")), reached=bool(f.steps))
    if (mla := mla_kv(f, m, tokens, blocks, when)) is not None:  # DeepSeek: the latent, not K and V
        return Part(p(mla[0], mla[1]), ("kv",), esc(fmt_bytes(mla[2] * tokens)), reached=bool(f.steps or f.generated))
    layers = esc(i18n.ngettext(f.lang, "{n} layer", "{n} layers", L))
    heads = esc(i18n.ngettext(f.lang, "{n} KV head", "{n} KV heads", KVH))
    size = said(f, "So that no step recomputes the past, each layer's keys and values are kept: 2 × {layers} × {heads} "
                   "× {dims} dims × {bytes} bytes = {total} bytes per token.", layers=layers, heads=heads, dims=str(D),
                bytes=str(b), total=n(per_token))
    values = {"when": when, "tokens": said_n(f, "{n} token", "{n} tokens", tokens),
              "size": esc(fmt_bytes(per_token * tokens)), "blocks": said_n(f, "{n} block", "{n} blocks", blocks),
              "per": str(bs), "pool": n(int(m["num_blocks"]))}
    # the replay's cursor (or the live request) may stand before the finish: say what has happened
    held = (said(f, "{when}this request held K/V for {tokens}: {size} in {blocks} of {per} tokens, taken from a shared "
                    "pool of {pool} blocks and handed back the moment it finished.", **values) if f.ended else
            said(f, "{when}this request held K/V for {tokens}: {size} in {blocks} of {per} tokens, taken from a shared "
                    "pool of {pool} blocks; they go back to the pool the moment it finishes.", **values))
    text = p(size, "" if f.idle else held, "" if f.idle else after_finish(f))
    return Part(text, ("kv",), esc(fmt_bytes(per_token * tokens)), reached=bool(f.steps or f.generated))


def after_finish(f: Facts) -> str:
    """What the finish's kv.free did with the blocks: freed, or kept by the prefix cache."""
    frees = f.kept.get("kv.free") or []
    if not f.finish or not frees or frees[-1].get("step") != f.finish.get("step"):
        return ""
    e = frees[-1]
    kept = len(e.get("cached") or ())
    freed = len(e["blocks"]) - kept
    held = int(e.get("released") or 0)
    words = [said_n(f, "{n} block went back to the free list", "{n} blocks went back to the free list", freed)
             if freed else "",
             said_n(f, "{n} full block stays in the prefix cache (free, but a later request that begins the same way "
                       "finds them until the pool needs the room)",
                    "{n} full blocks stay in the prefix cache (free, but a later request that begins the same way "
                    "finds them until the pool needs the room)", kept) if kept else "",
             said_n(f, "{n} block another request still holds kept its K/V",
                    "{n} blocks another request still holds kept their K/V", held) if held else ""]
    listed = [w for w in words if w]
    return said(f, "At the finish {what}.", what=said(f, ", and ").join(listed)) if listed else ""


def which_pass(f: Facts, e: dict) -> str:
    """'the pass that read «␣is» (position 30) and predicted «␣Paris»': the one meaning of a
    selection that every panel and sentence uses."""
    pos = int(e["position"])
    read = f.label(pos - 1)
    return said(f, "the pass that read {read} (position {position}) and predicted {token}",
                read=quote(read) if read is not None else said(f, "the token"), position=f"{pos - 1:,}",
                token=quote(e.get("token_text", "")))


def _after(f: Facts, row: int) -> str:
    """A logit-lens row as words: row 0 is the embedding, row i the output of layer i - 1."""
    if row == 0:
        return said(f, "right after the embedding")
    return said(f, "after layer {layer}", layer="<b>" + str(row - 1) + "</b>")


def _when(f: Facts, rows: list[dict], top: int | None, tok: str) -> str:
    """When the drawn token led the lens: never, inside only, at the output, or early on."""
    led = next((i for i, r in enumerate(rows) if r["chosen_rank"] == 1), None)
    if top is None and led is None:
        return said(f, "the drawn token {token} was never the top candidate (sampling picked a less likely one)",
                    token=tok)
    if top is None:  # it led somewhere inside, and lost the lead before the output
        return said(f, "the drawn token {token} was the top candidate {after} but not at the output (sampling "
                       "picked a less likely one)", token=tok, after=_after(f, led))
    if top == len(rows) - 1:
        return said(f, "{token} became the top candidate only at the output, after the last layer", token=tok)
    return said(f, "{token} was already the top candidate {after}, and stayed there", token=tok, after=_after(f, top))


def _lens_chip(f: Facts, top: int | None, last: int) -> str:
    if top is None:
        return esc(i18n.gettext(f.lang, "drawn below the top"))
    if top == last:
        return esc(i18n.gettext(f.lang, "top at the output"))
    if top:
        return esc(i18n.gettext(f.lang, "top after L{layer}", layer=top - 1))
    return esc(i18n.gettext(f.lang, "top at once"))


def lens(f: Facts) -> Part:
    """At which layer does the model already know its answer? Read from the selected pass (the
    panel shows the same one), then over every traced token."""
    L = f.model["num_layers"]
    what = said(f, "The last layer's output times the LM head gives one score per vocabulary entry. Put the residual "
                   "stream after the embedding and after every layer through the model's final norm and LM head (the "
                   "logit lens), and it says what the model would answer if it stopped there.")
    evs = f.kept["logit_lens"]
    e = f.pass_of("logit_lens")
    if e is None and f.hidden_from is not None:
        return Part(p(what, hidden_sentence(f)), ("logit_lens",), esc(i18n.gettext(f.lang, "hidden")))
    if e is None and not f.generated and not f.idle:  # no token yet (or never: it ended before one)
        return Part(p(what, not_yet(f)), ("logit_lens",), reached=False)
    if e is None:
        none = said(f, "This request has no logit lens: capture level full records one per generated token.")
        return Part(p(what, "" if f.idle else none), ("logit_lens",),
                    esc(i18n.gettext(f.lang, "not captured")) if f.finish else "", reached=bool(f.finish))
    rows = lens_layers(e)
    top, last = first_top(rows), len(rows) - 1
    near = next((i for i, r in enumerate(rows) if r["chosen_rank"] <= 10), None)
    rank = n(int(rows[0]["chosen_rank"]))
    near_text = (said(f, "It entered the top 10 {after} (the embedding alone ranked it {rank}).",
                      after=_after(f, near), rank=rank) if near not in (None, last, top) else
                 said(f, "The embedding alone ranked it {rank}.", rank=rank))
    read = said(f, "In {which}, {when}.", which=which_pass(f, e), when=_when(f, rows, top, quote(e.get("token_text", ""))))
    early = [t for t, x in zip(f.trail.lens_tops, evs) if t is not None and t < len(lens_layers(x)) - 1]
    median = (said(f, " (at the median, {after})", after=_after(f, int(statistics.median(early)))) if early else "")
    summary = said_n(f, "Over {traced}, {n} was settled before the last layer{median}.",
                     "Over {traced}, {n} were settled before the last layer{median}.", len(early),
                     traced=said_n(f, "the {n} traced token", "the {n} traced tokens", len(evs)), median=median)
    text = p(what, i18n.sentences(f.lang, read, near_text), summary,
             said(f, "The whole lens is one [{rows} × hidden] · [hidden × vocab] product per traced token.",
                  rows=str(L + 1)))
    return Part(text, ("logit_lens",), _lens_chip(f, top, last))
