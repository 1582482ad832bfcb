"""Speculative decoding: a draft (a small model, or n-gram lookup) proposes, the target verifies."""
from __future__ import annotations

from visualizers._html import esc
from visualizers.speculative import span_text
from visualizers.stages.facts import Facts, Part, asked, before_cut, hidden_rest, n, p, plural


def speculation(f: Facts) -> Part:
    spec = f.kept["spec"]
    if not spec and f.untraced:
        why = without(f.model, f.body)  # known at any level: a stage it skips, not one it did unrecorded
        if why is not None:
            return Part(p(f"This request {'ran' if f.finish else 'runs'} without speculative decoding: {why}."),
                        ("spec",), "off", skipped=True)
        return Part(p("This request's capture level (off) records no speculative rounds."), ("spec",), "")
    if not spec and f.hidden_from is not None and without(f.model, f.body) is None:
        return _on_before_rounds(f)
    if not spec:
        why = without(f.model, f.body)
        verb = "ran" if f.ended else "runs"
        if f.idle:  # before any request: what the stage does, not what a request did
            return Part(p("A draft (a small model, or n-gram lookup in the context) proposes k tokens and the target "
                          "verifies them all in one forward pass; with speculation off, one target pass per token.",
                          f"Off here: {why}." if why else ""), ("spec",), "off" if why else "",
                        skipped=why is not None, reached=why is not None)
        off = (f"This request {verb} without speculative decoding{': ' + why if why else ''}. One target forward "
               "pass per token. With speculation on, a draft (a small model, or n-gram lookup in the context) proposes k "
               "tokens and the target verifies them all in one pass.")
        # known from the start when the request cannot speculate: skipped at once, not unlit until the end
        done = bool(f.finish) or why is not None
        return Part(p(off), ("spec",), "off", skipped=done, reached=done)
    proposed, accepted = sum(s["k"] for s in spec), sum(s["accepted"] for s in spec)
    rounds = len(spec)
    per_pass = _kept_per_pass(f)
    share = accepted / max(1, proposed)
    if spec[0].get("method") == "ngram":
        text = _ngram(f, proposed, accepted, per_pass)
    else:
        text = p(f"A small draft model proposed up to {n(int(spec[0]['k']))} tokens per round; the target checked "
                 f"them all in one forward pass. Over {plural(rounds, 'round')} it proposed {n(proposed)} and the "
                 f"target kept {n(accepted)} ({share:.0%}), plus one token of its own each round (none after an "
                 f"end of sequence): {per_pass:.2f} tokens per target pass instead of 1.")
    if f.hidden_from is not None:  # a classroom's cut: the rounds the class sees, then what it does not
        text = p(f"Speculative decoding is on for this request; the class sees its rounds {before_cut(f)}.") + text + \
            p(f"Its later rounds are not shown: {hidden_rest(f)}.")
    return Part(text, ("spec",), f"{share:.0%} kept")


def _on_before_rounds(f: Facts) -> Part:
    """A classroom's cut before the first round: speculation is on, its rounds not shown yet."""
    k = int(((f.body or {}).get("speculative") or {}).get("num_tokens") or f.model.get("num_speculative_tokens") or 0)
    draft = ("n-gram lookup in the context (no draft model)" if f.model.get("draft") == "ngram" else
             "a small draft model")
    up_to = f"up to {n(k)} tokens" if k else "a few tokens"
    when = (f"No round came {before_cut(f)}: {hidden_rest(f)}." if asked(f) else
            f"The first answer token comes from the prefill, the rounds after it; {hidden_rest(f)}.")
    return Part(p(f"Speculative decoding is on for this request: {draft} proposes {up_to} a round and the target "
                  f"verifies them all in one forward pass. {when}"), ("spec",), "on")


# body fields whose stage reads the tokens before each draw (engine/penalties.py): with any of them
# on, the engine decodes one token a step (a verified round would need them per position)
ADJUSTING = ("presence_penalty", "frequency_penalty", "min_tokens", "logit_bias", "guided_json", "guided_regex",
             "guided_choice")


def without(model: dict, body: dict | None) -> str | None:
    """Why this request runs without speculative decoding, known before its first step (None:
    it may speculate, or nothing says it cannot)."""
    if not model.get("has_draft"):
        return "this model is served without a draft (start it with --draft MODEL or --draft ngram)"
    body = body or {}
    spec = body.get("speculative")
    if isinstance(spec, dict) and spec.get("enabled") is False:
        return "it was turned off for this request"
    fmt = body.get("response_format")
    rep = body.get("repetition_penalty")
    if any(body.get(k) for k in ADJUSTING) or (isinstance(fmt, dict) and fmt.get("type") not in (None, "text")) \
            or (isinstance(rep, (int, float)) and not isinstance(rep, bool) and rep != 1):
        return ("its penalties, logit bias, min_tokens or grammar change each draw's logits from the tokens before "
                "it, so the engine decodes such a request one token a step")
    return None


def _kept_per_pass(f: Facts) -> float:
    """Tokens the answer kept per verify pass: the streamed tokens of the verify steps (a round
    that overshoots an end of sequence keeps none past it), else accepted + one a round."""
    spec = f.kept["spec"]
    steps = {s["step"] for s in spec}
    kept = sum(1 for t in f.kept["token"] if t["step"] in steps)
    if not kept:
        kept = sum(s["accepted"] for s in spec) + len(spec)
    return kept / len(spec)


def _ngram(f: Facts, proposed: int, accepted: int, per_pass: float) -> str:
    """When the proposals came from n-gram lookup, with one round as the example."""
    spec = f.kept["spec"]
    plain = f.kinds.count("decode")
    look = spec[0].get("lookup", {})
    best = max(spec, key=lambda s: s["accepted"])
    gram, src, pt = best["ngram"], best["copied_from"], best["prompt_tokens"]

    def quote(texts: list[str]) -> str:
        return f"«{esc(''.join(texts))}»"
    rounds = len(spec)
    return p(
        "No draft model here: <b>n-gram lookup</b> (prompt lookup). Before each step the engine took the last n tokens "
        f"of prompt + answer, n from {n(int(look.get('max_n', gram['n'])))} down to "
        f"{n(int(look.get('min_n', gram['n'])))}, found their latest earlier occurrence, and proposed the tokens that "
        "followed it there. An answer that repeats its prompt (or itself) gets many tokens per pass for the price "
        "of a search.",
        f"{plural(rounds, 'round')} found a match and proposed {n(proposed)} tokens; the target kept {n(accepted)} "
        f"({accepted / max(1, proposed):.0%}), plus one token of its own each round: "
        f"{per_pass:.2f} tokens per target pass instead of 1. "
        f"{plural(plain, 'other step')} found no match (or {'was' if plain == 1 else 'were'} at the end) and decoded "
        "one token plainly.",
        f"For example, the {gram['n']} tokens {quote(gram['text'])} had occurred before at "
        f"{esc(span_text(gram['start'], gram['start'] + gram['n'] - 1, pt))}, so the engine copied "
        f"{quote(best['proposed_text'])} from {esc(span_text(src[0], src[-1], pt))}; the target kept "
        f"{n(int(best['accepted']))} of those {n(int(best['k']))}.",
        "A copy is certain (its q is 1): greedy keeps it when it is the target's top token; sampling keeps it with "
        "probability p, the target's, and after a rejection draws from p without that token, so the answer still "
        "follows the target's distribution.")
