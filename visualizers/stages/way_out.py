"""The way out: a token is sampled, streamed, and the request shares the engine with others."""
from __future__ import annotations

import statistics
from typing import Sequence

from visualizers import i18n
from visualizers._html import esc, fmt_ms
from visualizers.i18n import N_
from visualizers.sampling import DOES, STAGE_LABELS
from visualizers.stages.facts import (Facts, Part, before_cut, count, hidden_rest, hidden_sentence, n, p, plural, prob,
                                      quote, said, said_before_cut, said_hidden_rest, said_n)
from visualizers.stages.model import which_pass
from visualizers.stages.way_in import idle_words, not_yet, untraced_words


def sampling(f: Facts) -> Part:
    s = f.pass_of("sample")
    if s is None:
        if f.hidden_from is not None:
            return Part(p(said(f, "Softmax turns the LM head's scores into probabilities; then temperature, top-k and "
                                  "top-p cut the list and one token is drawn."), hidden_sentence(f)), ("sampling",),
                        esc(i18n.gettext(f.lang, "hidden")))
        if f.generated:  # capture level off: tokens were drawn, their distributions not recorded
            return Part(p(said(f, "Each step ended with logits over the vocabulary, cut by temperature, top-k and "
                                  "top-p, and one token drawn; this request's capture level records no "
                                  "distributions.")), ("sampling",), esc(i18n.gettext(f.lang, "not captured")))
        return Part(p(not_yet(f), said(f, "Each step ends with logits over the vocabulary, cut by temperature, top-k "
                                          "and top-p, and one token drawn.")), ("sampling",), reached=False)
    vocab = int(f.model["vocab_size"])
    draws = len(f.kept["sample"])
    cut = said(f, "Softmax turns the {vocab} scores into probabilities; then the knobs cut the list ({knobs}) and "
                  "one token is drawn.", vocab=n(vocab), knobs=_knobs(f, s.get("params", {})))
    drew = said(f, "In {which}, the engine drew {token} with probability {prob}; the distribution's entropy was "
                   "{entropy} nats.", which=which_pass(f, s), token=quote(s.get("token_text", "")),
                prob="<b>" + prob(float(s.get("token_prob", 0))) + "</b>", entropy=n(float(s.get("entropy", 0))))
    traced = said_n(f, "{n} draw was traced.", "{n} draws were traced.", draws)
    text = p(cut, _adjusted(f, s, vocab), i18n.sentences(f.lang, drew, traced))
    return Part(text, ("sampling",), prob_chip(float(s.get("token_prob", 0))))


def _knobs(f: Facts, prm: dict) -> str:
    """The sampling knobs of the draw, as words (greedy, or temperature, top-k, top-p)."""
    if prm.get("greedy"):
        return said(f, "greedy: always the most likely token, the same answer every time")
    top_k, temperature, top_p = prm.get("top_k"), format(prm.get("temperature", 1), "g"), format(prm.get("top_p", 1), "g")
    return said(f, "temperature {temperature}, top-k {top_k}, top-p {top_p}", temperature=temperature,
                top_k=str(top_k) if top_k else said(f, "off"), top_p=top_p)


# the stages before temperature that a sentence names (the others: the grammar mask's own sentence)
ADJUSTERS = {"min_tokens": N_("min_tokens"), "logit_bias": N_("logit bias"),
             "repetition_penalty": N_("repetition penalty"), "frequency_penalty": N_("frequency penalty"),
             "presence_penalty": N_("presence penalty")}


def _adjusted(f: Facts, s: dict, vocab: int) -> str:
    """What the stages before temperature (grammar mask, min_tokens, logit bias, penalties) did
    to this draw's logits, with their numbers ("" when none is on)."""
    parts = []
    for name, st in s.get("stages", {}).items():
        if name not in DOES:
            continue
        moved = int(st.get("moved", 0))
        if name == "grammar":
            parts.append(said(f, "the grammar mask allowed {kept} of the {vocab} tokens", kept=n(int(st.get("kept", 0))),
                              vocab=n(vocab)))
        else:
            label = esc(i18n.gettext(f.lang, ADJUSTERS.get(name, STAGE_LABELS[name])))
            parts.append(said_n(f, "the {stage} moved {n} logit", "the {stage} moved {n} logits", moved, stage=label))
    if not parts:
        return ""
    return said(f, "Before that, the request's own stages changed the logits (vLLM's order, as the table's columns "
                   "show): {changes}.", changes=said(f, "; ").join(parts))


def prob_chip(x: float) -> str:
    """The map's number for a draw, as its sentence says it."""
    return f"p {prob(x)}"


REASONS = {"stop": N_("the model produced an end-of-turn token (or a stop string)"), "length": N_("it reached max_tokens"),
           "abort": N_("it was stopped (a click or a closed connection)")}


def stream(f: Facts) -> Part:
    """The tokens leaving as server-sent events, and why the request stopped."""
    gen = f.n_gen
    if f.idle:
        return Part(p(idle_words(f), said(f, "Each token leaves as a server-sent event the moment it exists; the request ends at "
                                    "an end-of-turn token, a stop string or max_tokens.")), ("answer", "choices"),
                    reached=False)
    if f.hidden_from is not None:
        return _stream_cut(f, gen)
    fin = f.finish
    # ended before the engine produced a token (stopped while it waited): the stream carried only the end
    never = bool(fin) and not gen and not f.steps
    if never:
        left = said(f, "Never reached: no token was streamed; the request ended before the engine produced one.")
    elif f.finish:
        left = said_n(f, "Each token left as a server-sent event the moment it existed: {n} token.",
                      "Each token left as a server-sent event the moment it existed: {n} tokens.", gen)
    else:
        left = said_n(f, "Each token left as a server-sent event the moment it existed: {n} token so far.",
                      "Each token left as a server-sent event the moment it existed: {n} tokens so far.", gen)
    words = [left, _timing(f, f.kept["token"])]
    if fin:
        words += _ended(f, fin)
    else:
        words.append(said(f, "Still running. It will end at an end-of-turn token, a stop string or max_tokens."))
    return Part(p(*words, _choices(f)), ("answer", "choices"), _tokens_chip(f, gen),
                reached=bool(f.generated or fin) and not never)


def _tokens_chip(f: Facts, gen: int) -> str:
    return esc(i18n.ngettext(f.lang, "{n} token", "{n} tokens", gen))


def _ended(f: Facts, fin: dict) -> list[str]:
    """Why the request ended, its usage, and its preemptions."""
    u = fin.get("usage") or {}
    reason = str(fin.get("reason"))
    why = esc(i18n.gettext(f.lang, REASONS[reason])) if reason in REASONS else esc(reason)
    return [said(f, "It ended because {why}: finish_reason {reason}.", why=why, reason="<b>" + esc(reason) + "</b>"),
            said(f, "Usage: {prompt} prompt tokens ({cached} from the prefix cache) and {completion} completion "
                    "tokens.", prompt=n(int(u.get("prompt_tokens", 0))), cached=n(int(u.get("cached_tokens", 0))),
                 completion=n(int(u.get("completion_tokens", 0)))),
            said_n(f, "It was preempted {n} time.", "It was preempted {n} times.", int(fin["preemptions"]))
            if fin.get("preemptions") else ""]


def _stream_cut(f: Facts, gen: int) -> Part:
    """A classroom's cut recording: the tokens before the hidden one, and whether the request had ended."""
    shown = (said_n(f, "The class sees the answer's first {n} token, {before}.",
                    "The class sees the answer's first {n} tokens, {before}.", gen, before=said_before_cut(f)) if gen
             else said(f, "The class sees none of the answer yet."))
    state = (said(f, "The request has ended; {rest}.", rest=said_hidden_rest(f)) if f.ended else
             said(f, "The request is still running; {rest}.", rest=said_hidden_rest(f)))
    left = said(f, "Each token left as a server-sent event the moment it existed.")
    words = [i18n.sentences(f.lang, left, shown), _timing(f, f.kept["token"]), state]
    return Part(p(*words, _choices(f)), ("answer", "choices"),
                _tokens_chip(f, gen) if gen else esc(i18n.gettext(f.lang, "hidden")))


def _choices(f: Facts) -> str:
    choices = (f.body or {}).get("n")
    if isinstance(choices, int) and not isinstance(choices, bool) and choices > 1:
        return said(f, "It asked for {choices} choices (n): the prompt was prefilled once and its KV blocks are "
                       "shared; each choice draws its own tokens, side by side below. These stages trace choice 0.",
                    choices=n(choices))
    return ""


def _timing(f: Facts, tokens: Sequence[dict]) -> str:
    """The gaps between tokens, or, when a step releases several (speculative rounds), between
    those bursts (the tokens inside one leave together, microseconds apart)."""
    bursts: list[list[dict]] = []
    for t in tokens:
        if bursts and bursts[-1][0]["step"] == t["step"]:
            bursts[-1].append(t)
        else:
            bursts.append([t])
    if len(bursts) == len(tokens):
        lat = [t["latency"] for t in tokens[1:] if t.get("latency") is not None]
        return (said(f, "Between tokens: {median} at the median, {most} at most.",
                     median=esc(fmt_ms(statistics.median(lat))), most=esc(fmt_ms(max(lat)))) if lat else "")
    gaps = [b[0]["latency"] for b in bursts[1:] if b[0].get("latency") is not None]
    values = {"tokens": n(len(tokens)), "bursts": n(len(bursts)), "average": format(len(tokens) / len(bursts), ".1f"),
              "largest": str(max(len(b) for b in bursts))}
    if not gaps:
        return said(f, "They left in bursts: a verify step releases every token it kept at once, so the {tokens} "
                       "tokens came in {bursts} bursts, {average} tokens per burst on average (at most {largest}). "
                       "Inside a burst the tokens are microseconds apart; between bursts: none yet.", **values)
    return said(f, "They left in bursts: a verify step releases every token it kept at once, so the {tokens} tokens "
                   "came in {bursts} bursts, {average} tokens per burst on average (at most {largest}). Inside a burst "
                   "the tokens are microseconds apart; between bursts: {median} at the median, {most} at most.",
                median=esc(fmt_ms(statistics.median(gaps))), most=esc(fmt_ms(max(gaps))), **values)


def batching(f: Facts) -> Part:
    mine = f.steps
    never_waits = said(f, "The engine never waits for a batch to fill: a new request joins the next step.")
    if f.untraced:
        return Part(p(untraced_words(f), never_waits), ())
    if not mine:
        return Part(p(not_yet(f), never_waits), (), reached=bool(f.generated))
    shared = [s for s in mine if len(s["batch"]) > 1]
    upto = i18n.GAP.get(f.lang, " ") + said_before_cut(f) if f.hidden_from is not None else ""  # the steps the class sees
    if shared:
        what, chip = _shared(f, mine, shared, upto)
    else:
        steps = said_n(f, "{n} engine step", "{n} engine steps", len(mine))
        what = (said(f, "This request ran alone: in its {steps}{upto} no other request was in the batch (send two at "
                        "once, or watch an API request while the page streams, to see them share).",
                     steps=steps, upto=upto) if upto else
                said(f, "This request ran alone: in all {steps} no other request was in the batch (send two at once, or "
                        "watch an API request while the page streams, to see them share).", steps=steps))
        chip = esc(i18n.gettext(f.lang, "alone"))
    later = said(f, "Its later steps are not shown: {rest}.", rest=said_hidden_rest(f)) if upto else ""
    return Part(p(i18n.sentences(f.lang, said(f, "The engine never waits for a batch to fill."), what), later,
                  said(f, "A finishing request frees its slot and blocks at once; a new prefill joins while others "
                          "decode.")), (), chip)


def _shared(f: Facts, mine: list[dict], shared: list[dict], upto: str) -> tuple[str, str]:
    """The steps this request shared with others (its own other choices among them), and the chip."""
    others = {x["request_id"] for s in mine for x in s["batch"]} - {f.request_id}
    most = max(len(s["batch"]) for s in mine)
    own = sum(1 for o in others if o.startswith(f"{f.request_id}."))  # its n choices run as requests too
    values = {"steps": said_n(f, "{n} engine step", "{n} engine steps", len(mine)), "upto": upto,
              "others": said_n(f, "{n} other request", "{n} other requests", len(others)), "most": n(most)}
    if own:
        what = said_n(f, "Of this request's {steps}{upto}, {n} was shared with {others} ({own} of them its own other "
                         "choices) (at most {most} sequences in one step).",
                      "Of this request's {steps}{upto}, {n} were shared with {others} ({own} of them its own other "
                      "choices) (at most {most} sequences in one step).", len(shared), own=n(own), **values)
    else:
        what = said_n(f, "Of this request's {steps}{upto}, {n} was shared with {others} (at most {most} sequences in "
                         "one step).",
                      "Of this request's {steps}{upto}, {n} were shared with {others} (at most {most} sequences in one "
                      "step).", len(shared), **values)
    chip = esc(i18n.gettext(f.lang, "shared {shared} of {steps}", shared=i18n.number(f.lang, len(shared)),
                            steps=i18n.number(f.lang, len(mine))))
    return what, chip
