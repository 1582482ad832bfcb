"""Speculative decoding: a draft (a small model, or n-gram lookup) proposes, the target verifies."""
from __future__ import annotations

from visualizers import i18n
from visualizers._html import esc
from visualizers.i18n import N_
from visualizers.stages.facts import Facts, Part, asked, n, p, said, said_before_cut, said_hidden_rest, said_n

HOW = N_("A draft (a small model, or n-gram lookup in the context) proposes k tokens and the target verifies them "
         "all in one forward pass; with speculation off, one target pass per token.")


def speculation(f: Facts) -> Part:
    spec = f.kept["spec"]
    why = _why(f)
    if not spec and f.untraced:
        if why is not None:  # known at any level: a stage it skips, not one it did unrecorded
            text = (said(f, "This request ran without speculative decoding: {why}.", why=why) if f.finish else
                    said(f, "This request runs without speculative decoding: {why}.", why=why))
            return Part(p(text), ("spec",), _off(f), skipped=True)
        return Part(p(said(f, "This request's capture level (off) records no speculative rounds.")), ("spec",), "")
    if not spec and f.hidden_from is not None and why is None:
        return _on_before_rounds(f)
    if not spec:
        if f.idle:  # before any request: what the stage does, not what a request did
            return Part(p(said(f, HOW), said(f, "Off here: {why}.", why=why) if why else ""), ("spec",),
                        _off(f) if why else "", skipped=why is not None, reached=why is not None)
        # known from the start when the request cannot speculate: skipped at once, not unlit until the end
        done = bool(f.finish) or why is not None
        return Part(p(_off_words(f, why)), ("spec",), _off(f), skipped=done, reached=done)
    proposed, accepted = sum(s["k"] for s in spec), sum(s["accepted"] for s in spec)
    share = accepted / max(1, proposed)
    if spec[0].get("method") == "ngram":
        text = _ngram(f, proposed, accepted)
    else:
        rounds = said_n(f, "{n} round", "{n} rounds", len(spec))
        text = p(said(f, "A small draft model proposed up to {k} tokens per round; the target checked them all in one "
                         "forward pass. Over {rounds} it proposed {proposed} and the target kept {accepted} ({share}), "
                         "plus one token of its own each round (none after an end of sequence): {per_pass} tokens per "
                         "target pass instead of 1.", k=n(int(spec[0]['k'])),
                      rounds=rounds, proposed=n(proposed),
                      accepted=n(accepted), share=esc(i18n.percent(f.lang, share)), per_pass=_per(f)))
    if f.hidden_from is not None:  # a classroom's cut: the rounds the class sees, then what it does not
        text = p(said(f, "Speculative decoding is on for this request; the class sees its rounds {before}.",
                      before=said_before_cut(f))) + text + \
            p(said(f, "Its later rounds are not shown: {rest}.", rest=said_hidden_rest(f)))
    return Part(text, ("spec",), esc(i18n.gettext(f.lang, "{share} kept", share=i18n.percent(f.lang, share))))


def _off(f: Facts) -> str:
    return esc(i18n.gettext(f.lang, "off"))


def _per(f: Facts) -> str:
    """The tokens kept per target pass, two decimals."""
    return esc(i18n.number(f.lang, _kept_per_pass(f), 2))


def _span(f: Facts, first: int, last: int, prompt_tokens: int) -> str:
    """'tokens 12–15 of the prompt': context positions, counted within the prompt or within the
    answer, whichever holds them (as visualizers.speculative.span_text, in the stage's language)."""
    if last < prompt_tokens:
        one, many = N_("token {first} of the prompt"), N_("tokens {first}–{last} of the prompt")
    elif first >= prompt_tokens:
        first, last = first - prompt_tokens, last - prompt_tokens
        one, many = N_("token {first} of the answer so far"), N_("tokens {first}–{last} of the answer so far")
    else:
        one, many = N_("token {first} of the prompt + answer"), N_("tokens {first}–{last} of the prompt + answer")
    return said(f, one if first == last else many, first=str(first), last=str(last))


def _off_words(f: Facts, why: str | None) -> str:
    """A request that runs (or ran) with no speculation: why, and what speculation would do."""
    if why:
        first = (said(f, "This request ran without speculative decoding: {why}.", why=why) if f.ended else
                 said(f, "This request runs without speculative decoding: {why}.", why=why))
    else:
        first = (said(f, "This request ran without speculative decoding.") if f.ended else
                 said(f, "This request runs without speculative decoding."))
    return i18n.sentences(f.lang, first, said(f, "One target forward pass per token. With speculation on, a draft (a "
                                                 "small model, or n-gram lookup in the context) proposes k tokens and "
                                                 "the target verifies them all in one pass."))


def _on_before_rounds(f: Facts) -> Part:
    """A classroom's cut before the first round: speculation is on, its rounds not shown yet."""
    k = int(((f.body or {}).get("speculative") or {}).get("num_tokens") or f.model.get("num_speculative_tokens") or 0)
    draft = (said(f, "n-gram lookup in the context (no draft model)") if f.model.get("draft") == "ngram" else
             said(f, "a small draft model"))
    up_to = said(f, "up to {k} tokens", k=n(k)) if k else said(f, "a few tokens")
    when = (said(f, "No round came {before}: {rest}.", before=said_before_cut(f), rest=said_hidden_rest(f))
            if asked(f) else
            said(f, "The first answer token comes from the prefill, the rounds after it; {rest}.",
                 rest=said_hidden_rest(f)))
    return Part(p(i18n.sentences(f.lang, said(f, "Speculative decoding is on for this request: {draft} proposes {up_to} "
                                                 "a round and the target verifies them all in one forward pass.",
                                              draft=draft, up_to=up_to), when)), ("spec",),
                esc(i18n.gettext(f.lang, "on")))


# body fields whose stage reads the tokens before each draw (engine/penalties.py): with any of them
# on, the engine decodes one token a step (a verified round would need them per position)
ADJUSTING = ("presence_penalty", "frequency_penalty", "min_tokens", "logit_bias", "guided_json", "guided_regex",
             "guided_choice")
NO_DRAFT = N_("this model is served without a draft (start it with --draft MODEL or --draft ngram)")
TURNED_OFF = N_("it was turned off for this request")
ONE_A_STEP = N_("its penalties, logit bias, min_tokens or grammar change each draw's logits from the tokens before "
                "it, so the engine decodes such a request one token a step")


def without(model: dict, body: dict | None, lang: str = i18n.DEFAULT) -> str | None:
    """Why this request runs without speculative decoding, known before its first step (None:
    it may speculate, or nothing says it cannot), in `lang`."""
    if not model.get("has_draft"):
        return i18n.gettext(lang, NO_DRAFT)
    body = body or {}
    spec = body.get("speculative")
    if isinstance(spec, dict) and spec.get("enabled") is False:
        return i18n.gettext(lang, TURNED_OFF)
    fmt = body.get("response_format")
    rep = body.get("repetition_penalty")
    if any(body.get(k) for k in ADJUSTING) or (isinstance(fmt, dict) and fmt.get("type") not in (None, "text")) \
            or (isinstance(rep, (int, float)) and not isinstance(rep, bool) and rep != 1):
        return i18n.gettext(lang, ONE_A_STEP)
    return None


def _why(f: Facts) -> str | None:
    """without() in the stage's language, as HTML."""
    why = without(f.model, f.body, f.lang)
    return None if why is None else esc(why)


def _kept_per_pass(f: Facts) -> float:
    """Tokens the answer kept per verify pass: the streamed tokens of the verify steps (a round
    that overshoots an end of sequence keeps none past it), else accepted + one a round."""
    spec = f.kept["spec"]
    steps = {s["step"] for s in spec}
    kept = sum(1 for t in f.kept["token"] if t["step"] in steps)
    if not kept:
        kept = sum(s["accepted"] for s in spec) + len(spec)
    return kept / len(spec)


def _ngram(f: Facts, proposed: int, accepted: int) -> str:
    """When the proposals came from n-gram lookup, with one round as the example."""
    spec = f.kept["spec"]
    plain = f.kinds.count("decode")
    look = spec[0].get("lookup", {})
    best = max(spec, key=lambda s: s["accepted"])
    gram, src, pt = best["ngram"], best["copied_from"], best["prompt_tokens"]

    def quote(texts: list[str]) -> str:
        return f"«{esc(''.join(texts))}»"
    name = "<b>" + esc(i18n.gettext(f.lang, "n-gram lookup")) + "</b>"
    return p(
        said(f, "No draft model here: {name} (prompt lookup). Before each step the engine took the last n tokens of "
                "prompt + answer, n from {most} down to {least}, found their latest earlier occurrence, and proposed "
                "the tokens that followed it there. An answer that repeats its prompt (or itself) gets many tokens "
                "per pass for the price of a search.", name=name,
             most=n(int(look.get('max_n', gram['n']))), least=n(int(look.get('min_n', gram['n'])))),
        i18n.sentences(
            f.lang,
            said_n(f, "{n} round found a match and proposed {proposed} tokens; the target kept {accepted} ({share}), "
                      "plus one token of its own each round: {per_pass} tokens per target pass instead of 1.",
                   "{n} rounds found a match and proposed {proposed} tokens; the target kept {accepted} ({share}), "
                   "plus one token of its own each round: {per_pass} tokens per target pass instead of 1.",
                   len(spec), proposed=n(proposed), accepted=n(accepted),
                   share=esc(i18n.percent(f.lang, accepted / max(1, proposed))), per_pass=_per(f)),
            said_n(f, "{n} other step found no match (or was at the end) and decoded one token plainly.",
                   "{n} other steps found no match (or were at the end) and decoded one token plainly.", plain)),
        said(f, "For example, the {count} tokens {gram} had occurred before at {where}, so the engine copied {copied} "
                "from {source}; the target kept {kept} of those {k}.", count=str(gram['n']), gram=quote(gram['text']),
             where=_span(f, gram['start'], gram['start'] + gram['n'] - 1, pt),
             copied=quote(best['proposed_text']), source=_span(f, src[0], src[-1], pt),
             kept=n(int(best['accepted'])), k=n(int(best['k']))),
        said(f, "A copy is certain (its q is 1): greedy keeps it when it is the target's top token; sampling keeps it "
                "with probability p, the target's, and after a rejection draws from p without that token, so the "
                "answer still follows the target's distribution."))
