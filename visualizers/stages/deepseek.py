"""The stage sentences a DeepSeek model (V2 / V3) needs beside the others': multi-head
latent attention and its latent KV cache, and DeepSeek's MoE (shared experts, group-limited
routing, the balance bias), with this request's numbers. The page and the classroom read the
same model facts (app/serving/engine_service.py model_info: "mla", "deepseek_moe", "kv_*").
Each function returns None for a model without that part, so the caller keeps its own words."""
from __future__ import annotations

from typing import Sequence

from visualizers import i18n
from visualizers._html import esc, fmt_bytes
from visualizers.stages.facts import Facts, n, plural, said, said_n


def latent_dim(m: dict) -> int:
    mla = m.get("mla") or {}
    return int(mla.get("kv_lora_rank", 0)) + int(mla.get("qk_rope_head_dim", 0))


def mla_heads(f: Facts, m: dict) -> str | None:
    """How the heads attend, for layers(): no K/V per head, one latent they all read."""
    mla = m.get("mla")
    if not mla:
        return None
    rank, rope = n(int(mla["kv_lora_rank"])), n(int(mla["qk_rope_head_dim"]))
    return said_n(f, "{n} query head over multi-head latent attention (MLA): no head keeps keys and values of its own; "
                     "each token leaves one latent of {rank} numbers plus a {rope}-number RoPE key that every head "
                     "shares, and each head's keys and values are rebuilt from it (a decode step folds that rebuilding "
                     "into the query and the output, so it reads the latent as it lies in the cache)",
                  "{n} query heads over multi-head latent attention (MLA): no head keeps keys and values of its own; "
                  "each token leaves one latent of {rank} numbers plus a {rope}-number RoPE key that every head "
                  "shares, and each head's keys and values are rebuilt from it (a decode step folds that rebuilding "
                  "into the query and the output, so it reads the latent as it lies in the cache)",
                  int(m["num_heads"]), rank=rank, rope=rope)


def mla_kv(f: Facts, m: dict, tokens: int, blocks: int, when: str) -> tuple[str, str, int] | None:
    """kv()'s sentences for an MLA model: what a token keeps, what full K and V would take, and
    this request's share. -> (first sentence, second sentence, bytes per token), or None."""
    if not m.get("mla"):
        return None
    L, b, bs = int(m["num_layers"]), int(m["dtype_bytes"]), int(m["block_size"])
    latent = int(m.get("kv_values_per_token_layer") or latent_dim(m))
    per_token = int(m.get("kv_bytes_per_token") or L * latent * b)
    full = int(m.get("kv_full_bytes_per_token") or 0)
    mla = m["mla"]
    values = {"layers": esc(i18n.ngettext(f.lang, "{n} layer", "{n} layers", L)), "latent": n(latent),
              "rank": n(int(mla["kv_lora_rank"])), "rope": n(int(mla["qk_rope_head_dim"])), "bytes": str(b),
              "per": n(per_token)}
    if full:
        first = said(f, "So that no step recomputes the past, each layer keeps what attention needs of every token. "
                        "This model keeps the latent, not K and V: {layers} × {latent} numbers ({rank} latent + {rope} "
                        "RoPE key) × {bytes} bytes = {per} bytes per token; full keys and values for its {heads} heads "
                        "would take {full} bytes ({times}× more).", heads=n(int(m["num_heads"])), full=n(full),
                     times=format(full / max(per_token, 1), ".0f"), **values)
    else:
        first = said(f, "So that no step recomputes the past, each layer keeps what attention needs of every token. "
                        "This model keeps the latent, not K and V: {layers} × {latent} numbers ({rank} latent + {rope} "
                        "RoPE key) × {bytes} bytes = {per} bytes per token.", **values)
    kv_would = (said(f, " (K and V would have taken {size})", size=esc(fmt_bytes(full * tokens))) if full else "")
    second = said(f, "{when}this request held latents for {tokens}: {size} in {blocks} of {per} tokens{kv}, taken from "
                     "a shared pool of {pool} blocks and handed back the moment it finished.", when=when,
                  tokens=said_n(f, "{n} token", "{n} tokens", tokens), size=esc(fmt_bytes(per_token * tokens)),
                  blocks=said_n(f, "{n} block", "{n} blocks", blocks), per=str(bs), kv=kv_would,
                  pool=n(int(m["num_blocks"])))
    return first, second, per_token


def deepseek_ffn(f: Facts, m: dict, moe: Sequence[dict]) -> str | None:
    """_ffn()'s extra sentence for DeepSeek's MoE: shared experts, the group limit, the bias,
    with what the router did at the quoted layer (moe: that layer's routing events)."""
    ds = m.get("deepseek_moe")
    if not ds:
        return None
    E, k = int(m.get("num_experts") or 0), int(m.get("top_k") or 0)
    parts = []
    if ds.get("n_shared_experts"):
        shared = said_n(f, "{n} shared expert", "{n} shared experts", int(ds["n_shared_experts"]))
        parts.append(said(f, "Beside the {experts} routed experts, every token also passes through {shared}, with no "
                             "router.", experts=n(E), shared=shared))
    if int(ds.get("n_group") or 1) > 1:
        groups = [g for e in moe for g in e.get("groups", [])]
        values = {"k": n(k), "best": n(int(ds["topk_group"])), "groups": n(int(ds["n_group"]))}
        parts.append(said(f, "The router may pick its {k} only from the {best} best of {groups} expert groups; here the "
                             "tokens kept groups {most} most often.", most=_most(f, groups), **values) if groups else
                     said(f, "The router may pick its {k} only from the {best} best of {groups} expert groups.",
                          **values))
    if ds.get("correction_bias"):
        pairs = [(sorted(x), w) for e in moe for x, w in zip(e["experts"], e.get("without_bias", []))]
        changed = sum(x != w for x, w in pairs)
        scoring = esc(str(ds["scoring"]).capitalize())
        tokens = said_n(f, "{n} token", "{n} tokens", len(pairs))
        parts.append(said(f, "{scoring} scores plus a learned balance bias choose the experts, the scores without it "
                             "weigh them; the bias changed the picks of {changed} of {tokens}.", scoring=scoring,
                          changed=n(changed), tokens=tokens) if pairs else
                     said(f, "{scoring} scores plus a learned balance bias choose the experts, the scores without it "
                             "weigh them.", scoring=scoring))
    return i18n.sentences(f.lang, *parts) if parts else None


def _most(f: Facts, groups: Sequence[Sequence[int]]) -> str:
    """The most frequent kept groups, e.g. "1 and 3"."""
    counts: dict[int, int] = {}
    for kept in groups:
        for g in kept:
            counts[g] = counts.get(g, 0) + 1
    best = sorted(counts, key=lambda g: (-counts[g], g))[:max(1, len(groups[0]))]
    return said(f, " and ").join(str(g) for g in sorted(best))
