"""Logits -> next token, per sequence: [min_tokens -> logit_bias -> repetition, frequency and
presence penalties (adjust_stages), the knobs that are on] -> temperature -> top-k ->
top-p -> min-p -> draw.

Each sequence brings its own parameters and its own random generator, so a seeded
request draws the same tokens whatever else shares its batch.
"""
from __future__ import annotations

import math

import torch

from engine.penalties import ADJUSTMENTS, History, adjust_stages, changes
from engine.sampling_params import SamplingParams
from engine.trace.softmax_stats import SoftmaxStats, probability, softmax_stats


def filter_stages(logits: torch.Tensor, params: SamplingParams) -> dict[str, torch.Tensor]:
    """The logits after each knob in turn (float32, -inf where cut), for one sequence:
    temperature, top_k, top_p, min_p. A knob that is off passes its input on unchanged."""
    x = logits.float() / params.temperature
    stages = {"temperature": x}
    if params.top_k and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    stages["top_k"] = x
    if params.top_p < 1.0:
        x = x.masked_fill(outside_nucleus(torch.softmax(x, dim=-1), params.top_p), float("-inf"))
    stages["top_p"] = x
    if params.min_p > 0.0:
        probs = torch.softmax(x, dim=-1)
        x = x.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    stages["min_p"] = x
    return stages


def outside_nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """[V] bool: the tokens top-p drops. In order of probability a token is dropped when
    the mass before it already reaches top_p (the first always stays). Only the head of
    that order decides, so it is found by topk with k growing until the k-th token is
    dropped, not by sorting the vocabulary (on a CPU a sort of 49k probabilities costs many
    times a topk of a few hundred)."""
    V = probs.shape[-1]
    k = min(V, 256)
    while True:
        top, ids = torch.topk(probs, k)  # descending
        before = torch.cumsum(top, dim=-1) - top
        if k == V or before[-1] >= top_p:  # the k-th is dropped, so is every token after it
            drop = torch.ones_like(probs, dtype=torch.bool)
            drop[ids[before < top_p]] = False
            return drop
        k = min(V, 8 * k)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token drawn from probs [V] (any nonnegative weights): the first whose cumulative
    weight passes u * total, u uniform in [0, 1). torch.multinomial draws an exponential per
    token of the vocabulary; this is one cumsum and a binary search. In
    float64, so a token's share of the line is its probability to ~1e-16. Weights with no
    finite positive total (NaN or inf logits from a broken model) raise, as multinomial did."""
    cdf = probs.double().cumsum(dim=-1)
    total = float(cdf[-1])
    if not (0.0 < total < math.inf):
        raise ValueError(f"cannot draw a token: the probabilities sum to {total} (NaN or inf logits?)")
    u = torch.rand((1,), dtype=torch.float64, generator=generator, device=probs.device) * total
    return min(int(torch.searchsorted(cdf, u, right=True)), probs.shape[-1] - 1)


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Scaled and masked logits (float32, -inf where cut) for one sequence: [V]."""
    return filter_stages(logits, params)["min_p"]


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """torch.argmax over the last dim of [N, V] logits (the first index of the maximum, NaN
    counting as the maximum), faster on the CPU for a large vocabulary: torch.argmax walks
    the row element by element, a max is vectorised. So the max of each chunk, then argmax
    over the chunk maxima picks the first chunk holding the row's maximum, and argmax within
    that chunk its first index (a gain from about 16k logits; none at 4k)."""
    N, V = logits.shape
    chunk = min(V & -V, 1024)  # the largest power of two <= 1024 that divides V
    if logits.device.type != "cpu" or chunk < 64 or V < 16384 or not logits.is_contiguous():  # (gains from ~16k)
        return torch.argmax(logits, dim=-1)
    chunks = logits.view(N, V // chunk, chunk)
    best = torch.argmax(chunks.amax(dim=-1), dim=-1)  # [N] chunk holding each row's maximum
    rows = torch.arange(N, device=logits.device)
    return torch.argmax(chunks[rows, best], dim=-1) + best * chunk


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
           stages: dict[int, dict[str, torch.Tensor]] | None = None,
           histories: list[History | None] | None = None) -> list[int]:
    """logits: [N, V], one row per sequence that draws a token this step. stages: where
    to keep each row's stages (by row; a plain greedy row has none), for explain to reuse.
    histories: each row's tokens, for the rows whose params adjust the logits (penalties...)."""
    adjusted = {i: adjust_stages(logits[i], p, histories[i]) for i, p in enumerate(params) if p.adjusts_logits}
    adjusted = {i: a for i, a in adjusted.items() if a}  # min_tokens alone, once reached, changes nothing
    greedy_rows = [i for i, p in enumerate(params) if p.greedy and i not in adjusted]
    tokens = [0] * len(params)
    if greedy_rows:
        greedy_logits = logits if len(greedy_rows) == len(logits) else logits[greedy_rows]  # all greedy: no copy
        picks = greedy_tokens(greedy_logits).tolist()
        for i, t in zip(greedy_rows, picks):
            tokens[i] = t
    for i, p in enumerate(params):
        if p.greedy and i not in adjusted:
            continue
        knobs = dict(adjusted.get(i, {}))
        x = list(knobs.values())[-1] if knobs else logits[i]
        if p.greedy:
            tokens[i] = int(torch.argmax(x))
        else:
            knobs.update(filter_stages(x, p))
            tokens[i] = draw(torch.softmax(knobs["min_p"], dim=-1), generators[i])
        if stages is not None:
            stages[i] = knobs
    return tokens


def explain(logits: torch.Tensor, params: SamplingParams, token_id: int, top: int,
            knobs: dict[str, torch.Tensor] | None = None, raw_stats: SoftmaxStats | None = None) -> dict:
    """The sampling stages of one draw, for the trace: the top candidates before and
    after each knob, how many tokens survive each cut, and the token drawn. Plain Python
    values, read from the logits without a softmax (softmax_stats): this runs
    for every traced token. knobs: filter_stages of these logits, if the draw kept them.
    raw_stats: softmax_stats(logits[None], k >= top), where the caller has them (a token
    with a logit lens needs them too): read instead of a second pass over the row."""
    raw = logits.float()
    stages = {"logits": raw}
    if knobs is not None:
        stages.update(knobs)
    elif not params.greedy:
        stages.update(filter_stages(raw, params))
    distinct = list({id(x): x for x in stages.values()}.values())  # a knob that is off repeats its input
    row = {id(x): i for i, x in enumerate(distinct)}
    one = len(distinct) == 1  # no knob changed the logits (a plain greedy draw)
    s = raw_stats if one and raw_stats is not None else softmax_stats(torch.stack(distinct) if not one else raw[None], top)
    ids = s.top_ids[0][:top]  # the candidates: the most likely before any knob, the token drawn, and what moved most
    moves = _moves(stages)
    for t in [token_id] + [c[0] for _, changed in moves.values() for c in changed]:
        if t not in ids:
            ids.append(t)
    if one and len(ids) == min(top, len(s.top_ids[0])) and (not ids or min(ids) >= 0):
        probs = [s.top_probs[0][:top]]  # the candidates are the row's top ones: their probabilities are known
    else:
        z = raw[None] if one else torch.stack(distinct)  # [S, V]
        probs = [[probability(v - lse) for v in r] for r, lse in zip(z[:, ids].tolist(), s.lse)]
    final = row[id(list(stages.values())[-1])]  # the distribution drawn from: after the last knob
    shown = {name: {"probs": probs[row[id(x)]], "kept": s.kept[row[id(x)]]} for name, x in stages.items()}
    for name, (moved, changed) in moves.items():
        shown[name].update(moved=moved, changes=changed)
    return {
        "candidates": ids,
        "stages": shown,
        "params": {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
                   "min_p": params.min_p, "greedy": params.greedy, **_adjustment_params(params)},
        "token_id": token_id,
        "token_prob": probs[final][ids.index(token_id)],
        "entropy": s.entropy[final],
    }


MOVES_SHOWN = 5  # per adjusting stage: the tokens whose logit moved most


def _moves(stages: dict[str, torch.Tensor]) -> dict[str, tuple[int, list[list]]]:
    """For each stage before temperature that is on: how many logits it moved, the largest moves."""
    names = list(stages)
    return {name: changes(stages[names[i - 1]], stages[name], MOVES_SHOWN)
            for i, name in enumerate(names) if name in ADJUSTMENTS}


def _adjustment_params(params: SamplingParams) -> dict:
    """The knobs before temperature that are on (the trace's params name only those)."""
    on = {"min_tokens": params.min_tokens, "repetition_penalty": params.repetition_penalty != 1.0,
          "frequency_penalty": params.frequency_penalty, "presence_penalty": params.presence_penalty}
    out = {name: getattr(params, name) for name, active in on.items() if active}
    if params.structured is not None:
        out["structured"] = params.structured.kind
    if params.logit_bias:
        out["logit_bias"] = {str(k): v for k, v in params.logit_bias.items()}
    return out
