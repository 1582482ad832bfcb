"""Every trace event the engine emits, built here: one function per event type, each
returning the event as (type, request_id, data), which the engine hands to
`Tracer.emit_plain` with its step count. The schema version is tracer.SCHEMA_VERSION.

The data is made of JSON values already: built from plain Python values (the captures
are plain lists, trace.capture), or walked once by `jsonable` where a field may
hold a caller's list or a tuple (those events are few per request). A builder runs only
for a traced request: an untraced one pays for none of this.
"""
from __future__ import annotations

from itertools import chain
from typing import Callable

import torch

from engine.config import ModelConfig
from engine.outputs import TokenOutput
from engine.sequence import ScheduledSeq, Sequence
from engine.speculative.verify import Verdict
from engine.trace import compact as compact_form
from engine.trace.capture import AttentionCapture
from engine.trace.moe_lists import rounded
from engine.trace.softmax_stats import SoftmaxStats, softmax_stats
from engine.trace.tracer import jsonable

Event = tuple[str, str | None, dict]  # type, request id (None: the whole step), data
Piece = Callable[[int], str]  # a token's text, special tokens included (a replay has no tokenizer)
LENS_DIGITS = 4  # significant digits: a lens row's chosen token may have p = 1e-9, which 4 decimals zero
SAMPLE_DIGITS = 6  # significant digits of a sample event's probabilities (the page prints 3 decimals)


# --- request -------------------------------------------------------------------------

def request_arrive(seq: Sequence, messages: list[dict] | None) -> Event:
    p = seq.params
    return "request.arrive", seq.request_id, jsonable({
        "prompt": seq.prompt, "messages": messages,
        "params": {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p,
                   "seed": p.seed, "max_tokens": p.max_tokens, "stop": p.stop, "ignore_eos": p.ignore_eos},
        "trace_level": seq.trace_level,
        # when tokenizing ended (perf_counter, as ts): the event itself may wait for the engine's lock
        "tokenized_at": round(seq.tokenized_time, 6)})


def tokenize(seq: Sequence, pieces: list[str], vocab_size: int, tokenizer_size: int, chat_template: bool) -> Event:
    """pieces: the prompt's tokens as text; vocab_size: the model's logits, tokenizer_size: the tokenizer's."""
    return "tokenize", seq.request_id, jsonable({
        "tokens": pieces, "count": seq.num_prompt_tokens, "vocab_size": vocab_size,
        "tokenizer_size": tokenizer_size, "chat_template": chat_template,
        "seconds": seq.tokenized_time - seq.arrival_time})


def trace_truncated(request_id: str, limit_bytes: int, first_step: int, position: int, token_index: int) -> Event:
    """A reader's byte cap stopped the request's tensor captures (LLMEngine.stop_captures):
    the first pass whose captures are missing (in part or in full) ran in engine step
    `first_step`, its rows began at position `position` (a decode pass reads the newest
    token there), and it predicted answer token `token_index` (0: the first)."""
    return "trace.truncated", request_id, {"limit_bytes": limit_bytes, "first_step": first_step,
                                          "position": position, "token_index": token_index}


def finish(seq: Sequence, reason: str, metrics: dict) -> Event:
    return "finish", seq.request_id, jsonable({
        "reason": reason, "text": seq.text,
        "usage": {"prompt_tokens": seq.num_prompt_tokens, "completion_tokens": seq.num_output_tokens,
                  "cached_tokens": seq.num_cached_tokens},
        **metrics})


# --- prefix cache and KV pool (engine/block_manager.py) ---------------------------------

def prefix_cache_lookup(seq: Sequence, hits: list[int], block_size: int, hashes: list[int] | None = None) -> Event:
    """hashes: each hit block's chain hash (block_manager.chain_hash), the key the lookup found."""
    return "prefix_cache.lookup", seq.request_id, jsonable({
        "hit": bool(hits), "cached_blocks": hits, "cached_tokens": seq.num_cached_tokens, "prompt_tokens": len(seq),
        "full_blocks": (len(seq) - 1) // block_size, "readmission": seq.num_preemptions > 0,
        **({"hashes": hashes} if hashes else {})})


def kv_share(seq: Sequence, hits: list[int]) -> Event:
    return "kv.share", seq.request_id, jsonable({"blocks": hits, "tokens": seq.num_cached_tokens})


def kv_alloc(seq: Sequence, new: list[int]) -> Event:
    return "kv.alloc", seq.request_id, jsonable({"blocks": new, "table": list(seq.block_table)})


def kv_free(seq: Sequence, freed: list[int], cached: list[int], released: int) -> Event:
    """freed: blocks nobody references now (cached: those of them the prefix cache keeps);
    released: references dropped on blocks still shared."""
    return "kv.free", seq.request_id, jsonable({"blocks": freed, "cached": cached, "released": released})


def kv_rollback(seq: Sequence, freed: list[int], cached: list[int], released: int) -> Event:
    """Blocks of rejected speculative positions, as kv_free counts them."""
    return "kv.rollback", seq.request_id, jsonable({"blocks": freed, "cached": cached, "released": released})


def kv_evict(seq: Sequence, block: int) -> Event:
    return "kv.evict", seq.request_id, jsonable({"block": block})


def kv_exhausted(seq: Sequence, num_blocks: int) -> Event:
    return "kv.exhausted", seq.request_id, jsonable({"blocks": num_blocks, "tokens": len(seq)})


def kv_pool(num_blocks: int, block_size: int, full: bool, blocks: list[int],
            states: list[tuple[tuple[str, ...], int, int, bool]], request_ids: list[str]) -> Event:
    """The pool after a step (engine/trace/kv_pool.py): each listed block's owners, ref, fill,
    cached (states: index for index with blocks); request_ids: whose trace it belongs to."""
    return "kv.pool", None, {"num_blocks": num_blocks, "block_size": block_size, "full": full, "blocks": blocks,
                             "owners": [list(s[0]) for s in states], "ref": [s[1] for s in states],
                             "fill": [s[2] for s in states], "cached": [s[3] for s in states],
                             "request_ids": request_ids}


def kv_fill(s: ScheduledSeq, block_size: int) -> Event:
    """Where this step's tokens of s went: each block's slots written, in order."""
    seq, bs = s.seq, block_size
    fills, pos, end = [], s.start, s.start + s.num_tokens
    while pos < end:
        n = min(end, (pos // bs + 1) * bs) - pos
        fills.append({"block": seq.block_table[pos // bs], "offset": pos % bs, "count": n})
        pos += n
    return "kv.fill", seq.request_id, {"fills": fills, "tokens": end, "blocks": len(seq.block_table),
                                       "kind": s.kind}


# --- the step -----------------------------------------------------------------------

def schedule_preempt(seq: Sequence) -> Event:
    return "schedule.preempt", seq.request_id, jsonable({"tokens": len(seq)})


def schedule_step(scheduled: list[ScheduledSeq], phases: dict, forward_seconds: float, num_tokens: int,
                  running: int, waiting: int, free_blocks: int, cached_blocks: int, attention: str = "",
                  moe: str = "") -> Event:
    """phases: the step's start (perf_counter) and its schedule and sample seconds (the forward
    pass is forward_seconds, less the captures the runner collected after it: those, and what
    follows this event, are the trace's own work, schedule_traced); attention: the
    way the pass's attention ran (engine/code_ran.py), only where it is news to a request in it
    ("" leaves it out: each request's earlier step said it); moe: the way its MoE layers ran, alike."""
    # seconds to the microsecond, as every timeline reads them: a token's step events stay small
    data = {k: round(v, 6) for k, v in phases.items()}  # (one dict filled in order: every traced step's)
    data["forward_seconds"], data["num_tokens"] = round(forward_seconds, 6), num_tokens
    data["batch"] = [{"request_id": s.seq.request_id, "kind": s.kind, "start": s.start, "num_tokens": s.num_tokens}
                     for s in scheduled]
    data["running"], data["waiting"], data["free_blocks"], data["cached_blocks"] = \
        running, waiting, free_blocks, cached_blocks
    if attention:
        data["attention"] = attention
    if moe:
        data["moe"] = moe
    return "schedule.step", None, data


def schedule_traced(trace_seconds: float, lens_seconds: float) -> Event:
    """After a traced step: what its tracing cost on the engine's thread, apart from the engine's
    own work (schedule.step's phases): a `full` trace's captures collected after the forward,
    the events built after the pass, lens_seconds of it the logit lenses computed then (engine/trace/lens_queue.py)."""
    return "schedule.traced", None, {"trace_seconds": round(trace_seconds, 6),
                                     "lens_seconds": round(lens_seconds, 6)}


def schedule_collective(scheduled: list[ScheduledSeq], placement: dict, collectives: list[dict],
                        forward_seconds: float) -> Event:
    """A sharded step: what crossed between the ranks (engine/parallel)."""
    return "schedule.collective", None, {
        "placement": placement, "collectives": collectives, "forward_seconds": forward_seconds,
        "batch": [{"request_id": s.seq.request_id} for s in scheduled]}


# --- a `full` trace's captures (AttentionCapture and the rest) -----------------------------
# Each is cut at `end`: the first position of the pass that no kept token came from (a
# speculative round that drew an end of sequence keeps nothing after it, so nothing after
# it is captured); the big tensors are stored compactly (compact_form) unless
# the spec asks for lists.

def embed(s: ScheduledSeq, rows: torch.Tensor, hidden_size: int, end: int, compact: bool = True) -> Event | None:
    n = min(rows.shape[0], end - s.start)
    if n <= 0:
        return None
    rows = rows[:n]
    return "embed", s.seq.request_id, {"start": s.start, "token_ids": s.token_ids()[:n], "shape": [n, hidden_size],
                                       "dims": rows.shape[1],
                                       "rows": compact_form.encode_rows(rows) if compact else rounded(rows)}


def attention(s: ScheduledSeq, captured: AttentionCapture, heads: list[int], cfg: ModelConfig, end: int,
              compact: bool = True) -> Event | None:
    """One pass of s, every captured layer: probs [layers, heads kept, rows, keys], the query
    rows from q_start; the key columns: positions 0 .. k_head - 1, then k_start on (both cut
    at `end`; k_head 0: one run from k_start, as before the field existed)."""
    rows = min(captured.probs.shape[2], end - captured.q_start)
    if rows <= 0:
        return None
    keys = captured.k_head + max(0, end - captured.k_start)
    probs = captured.probs[:, :, :rows, :keys]
    group = cfg.num_heads // cfg.num_kv_heads
    return "attention", s.seq.request_id, {
        "layers": list(captured.layers), "windows": list(captured.windows), "kind": s.kind, "heads": list(heads),
        "kv_heads": [h // group for h in heads], "num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads,
        "q_start": captured.q_start, "k_start": captured.k_start, "k_head": captured.k_head,
        "probs": compact_form.encode_probs(probs) if compact else rounded(probs)}


def moe(s: ScheduledSeq, layer: int, captured: dict, batch_load: list[int], cfg: ModelConfig,
        end: int) -> Event | None:
    """captured: the layer's routing of s's tokens (experts, weights); batch_load: tokens per expert.
    DeepSeek MoE adds, per token: scores (the picks' sigmoid / softmax scores, before the bias),
    biased and without_bias (V3: with the balance bias; the picks it would make without),
    groups (the expert groups kept); and "deepseek": the routing's rules."""
    n = end - s.start
    if n <= 0:
        return None
    data = {"layer": layer, "start": s.start, "experts": captured["experts"][:n],
            "weights": captured["weights"][:n], "num_experts": cfg.num_experts,
            "top_k": cfg.num_experts_per_tok, "batch_load": batch_load}
    if (m := cfg.deepseek_moe) is not None:  # DeepSeek MoE: per token scores / groups, and the routing's rules
        data.update({k: v[:n] for k, v in captured.items() if k not in ("experts", "weights")})
        data["deepseek"] = {"shared_experts": m.n_shared_experts, "scoring": m.scoring, "n_group": m.n_group,
                            "topk_group": m.topk_group, "correction_bias": m.correction_bias,
                            "routed_scaling_factor": m.routed_scaling_factor}
    return "moe", s.seq.request_id, data


# --- each new token ------------------------------------------------------------------

def sample(seq: Sequence, source: str, method: str | None, token: int, info: dict, piece: Piece) -> Event:
    """The target's distribution at the new token's position; info: sampler.explain's stages.
    source: target, draft, corrected or bonus (method: the proposer's, None for the target).
    Its floats keep SAMPLE_DIGITS significant digits: more than the page prints, a third
    fewer bytes than a float's repr."""
    return "sample", seq.request_id, {"position": len(seq), "source": source, "method": method,
                                      "candidate_texts": [piece(t) for t in info["candidates"]],
                                      "token_text": piece(token), **_significant(info)}


def logit_lens(seq: Sequence, source: str, logits: torch.Tensor, chosen: int, top: int, piece: Piece) -> Event:
    """logits: [L + 1, vocab] at the new token's position (engine/trace/logit_lens.py rows());
    chosen: the token finally drawn there. One entry per residual-stream point in each of
    `top_ids`, `top_probs` (its `top` candidates), `chosen_rank` (1 = the top candidate) and
    `chosen_prob`; `texts`: each listed id's text, once (columns, not a dict per row: half the
    bytes; visualizers.compact.lens_layers gives the rows back)."""
    return logit_lens_of(seq.request_id, len(seq), source, chosen,
                         softmax_stats(logits, top, [chosen] * logits.shape[0]), piece)


def logit_lens_of(request_id: str, position: int, source: str, chosen: int, s: SoftmaxStats,
                  piece: Piece) -> Event:
    """logit_lens() from the lens's stats (L + 1 rows, the model's own last), computed after
    the step (engine/trace/lens_queue.py): the token at `position` is long appended by then."""
    texts = {str(t): piece(t) for t in dict.fromkeys(chain.from_iterable(s.top_ids))}
    # rounded to LENS_DIGITS in the comprehensions, not a call each: (L + 1) x (top + 1) floats a token
    return "logit_lens", request_id, {"position": position, "source": source, "token_id": chosen,
                                          "token_text": piece(chosen), "top_ids": s.top_ids,
                                          "top_probs": [[float(f"{p:.{LENS_DIGITS}g}") for p in ps]
                                                        for ps in s.top_probs],
                                          "chosen_rank": list(s.rank),
                                          "chosen_prob": [float(f"{p:.{LENS_DIGITS}g}") for p in s.chosen_probs],
                                          "texts": texts}


def spec(s: ScheduledSeq, verdict: Verdict, piece: Piece, details: dict, kept: int, proposed: int) -> Event:
    """One speculative round of s: its proposals, their p and q, what was kept, and the token
    the target added; details: the proposer's own (Proposer.describe). kept: the round's tokens
    the sequence kept; proposed: its proposals at positions up to the last kept one (fewer
    than k where the sequence ended inside the round: nothing after its end is reported, and
    then no corrected or bonus token either when the end was an accepted proposal)."""
    seq, accepted = s.seq, min(verdict.accepted, kept)
    extra = kept > verdict.accepted  # the target's corrected or bonus token was kept
    drafts = s.draft_tokens[:proposed]
    token = verdict.tokens[-1] if extra else None
    kind = None if token is None else "corrected" if verdict.accepted < len(s.draft_tokens) else "bonus"
    if "copied_from" in details:  # n-gram lookup: where each proposal came from
        details = {**details, "copied_from": details["copied_from"][:proposed]}
    return "spec", seq.request_id, jsonable({
        "k": len(drafts), "proposed": drafts, "proposed_text": [piece(t) for t in drafts],
        "draft_probs": verdict.draft_probs[:proposed], "target_probs": verdict.target_probs[:proposed],
        "accepted": accepted, "rejected_position": accepted if kind == "corrected" and accepted < len(drafts) else None,
        "token": token, "token_text": None if token is None else piece(token), "token_kind": kind,
        "cut_after_end": len(s.draft_tokens) - len(drafts),
        "acceptance_rate": seq.spec_accepted / max(seq.spec_proposed, 1), "greedy": seq.params.greedy, **details})


def token(seq: Sequence, out: TokenOutput) -> Event:
    """A streamed token; latency: since the previous token (the first: since arrival)."""
    prev = seq.token_times[-2] if len(seq.token_times) > 1 else seq.arrival_time
    return "token", seq.request_id, {"token_id": out.token_id, "text": out.text, "index": out.index, "t": out.time,
                                     "latency": seq.token_times[-1] - prev}


def _significant(x):
    """Floats anywhere in x to SAMPLE_DIGITS significant digits (ints, strings kept). A list's
    plain items are done in its comprehension, not a call each (a sample event's lists)."""
    if isinstance(x, float):
        return float(f"{x:.{SAMPLE_DIGITS}g}")
    if isinstance(x, dict):
        return {k: _significant(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [float(f"{v:.{SAMPLE_DIGITS}g}") if type(v) is float else v if type(v) in _KEPT else _significant(v)
                for v in x]
    return x


_KEPT = (int, str, bool, type(None))  # returned as they are by _significant
