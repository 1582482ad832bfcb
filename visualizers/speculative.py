"""Stage 12: speculative decoding: each round's proposed, accepted and rejected draft
tokens, the bonus (or corrected) token from the target, and the acceptance rate. With
n-gram lookup (no draft model) each round also says where its proposals were copied from."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from visualizers._html import empty, esc, panel, prob, said_html, said_html_n, show_piece
from visualizers.i18n import N_, gettext, number, percent
from visualizers.selection import Selection, header_html

MAX_ROUNDS = 12


@dataclass(frozen=True)
class Totals:
    """A request's speculative rounds summed, counting only the tokens its answer kept (a round
    that ended the answer on an accepted proposal adds no token of the target's)."""
    rounds: int
    proposed: int
    accepted: int  # proposals kept
    own: int  # corrected or bonus tokens from the target
    kept: int  # accepted + own: the answer's tokens that came from rounds

    @property
    def per_pass(self) -> float:
        return self.kept / max(self.rounds, 1)

    @property
    def rate(self) -> float:
        return self.accepted / max(self.proposed, 1)


def totals(rounds: Sequence[dict]) -> Totals:
    """rounds: `spec` events (an older trace's always add a token: "token" set)."""
    accepted = sum(r["accepted"] for r in rounds)
    own = sum(1 for r in rounds if r.get("token", 0) is not None)
    return Totals(len(rounds), sum(r["k"] for r in rounds), accepted, own, accepted + own)


def count(n: int, word: str) -> str:
    """'1 round', '3 rounds' (plain text)."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def span_text(first: int, last: int, prompt_tokens: int, lang: str = "en") -> str:
    """'tokens 12–15 of the prompt' (plain text): context positions, counted within the
    prompt or within the answer, whichever holds them."""
    if last < prompt_tokens:
        where = gettext(lang, "of the prompt")
    elif first >= prompt_tokens:
        first, last, where = first - prompt_tokens, last - prompt_tokens, gettext(lang, "of the answer so far")
    else:
        where = gettext(lang, "of the prompt + answer")
    return (gettext(lang, "token {i} {where}", i=first, where=where) if first == last else
            gettext(lang, "tokens {first}–{last} {where}", first=first, last=last, where=where))


def copy_source(r: dict, lang: str = "en") -> str:
    """HTML: where an n-gram round's proposals came from, and the n-gram that matched."""
    src, gram, p = r["copied_from"], r["ngram"], r["prompt_tokens"]
    matched = "".join(f'<span class="tt-chip">{show_piece(t)}</span>' for t in gram["text"])
    said = said_html(lang, "copied from {source}, after the {n}-gram {matched} at {at}",
                     source=esc(span_text(src[0], src[-1], p, lang)), n=esc(gram["n"]), matched=matched,
                     at=esc(span_text(gram["start"], gram["start"] + gram["n"] - 1, p, lang)))
    return f"<div class='tt-note'>{said}</div>"


CHIP = {"accepted": N_("accepted"), "rejected": N_("rejected"), "skipped": N_("not checked (after a rejection)")}
LEGEND = (("tt-acc", N_("accepted")), ("tt-rej", N_("rejected")), ("tt-skip", N_("not checked")),
          ("tt-bonus", N_("bonus")), ("tt-corrected", N_("corrected")))
KIND = {"bonus": N_("bonus token from the target"), "corrected": N_("corrected token from the target")}


def _chips(r: dict, pieces: Mapping[int, str] | None, lang: str) -> str:
    """One round's proposals (accepted, rejected, not checked), then the target's own token."""
    copied, chips = r.get("method") == "ngram", []
    for j, text in enumerate(r["proposed_text"]):
        state = "accepted" if j < r["accepted"] else "rejected" if j == r["accepted"] else "skipped"
        cls = {"accepted": "tt-acc", "rejected": "tt-rej", "skipped": "tt-skip"}[state]
        q = r["draft_probs"][j] if j < len(r["draft_probs"]) else 0
        p = r["target_probs"][j] if j < len(r["target_probs"]) else 0
        origin = gettext(lang, "copied from position {position}", position=r["copied_from"][j]) if copied else \
            gettext(lang, "draft q={q}", q=prob(q))
        tip = gettext(lang, "{what} · {origin} · target p={p}", what=gettext(lang, CHIP[state]), origin=origin, p=prob(p))
        chips.append(f'<span class="tt-chip {cls}" title="{esc(tip)}">{show_piece(text)}'
                     f'<sub>{esc(r["proposed"][j])}</sub></span>')
    kind = r["token_kind"]
    if r.get("token") is not None:  # None: the answer ended on an accepted proposal, no token added
        text = r["token_text"] or (pieces or {}).get(r["token"], "")  # special tokens decode to ""
        tip = gettext(lang, KIND[kind]) if kind in KIND else gettext(lang, "{kind} token from the target", kind=kind)
        chips.append(f'<span class="tt-chip tt-{esc(kind)}" title="{esc(tip)}">'
                     f'{show_piece(text)}<sub>{esc(r["token"])}</sub></span>')
    if r.get("cut_after_end"):
        cut = said_html_n(lang, "the answer ended here: {n} later proposal not counted",
                          "the answer ended here: {n} later proposals not counted", r["cut_after_end"])
        chips.append(f"<span class='tt-note'>{cut}</span>")
    return "".join(chips) + (copy_source(r, lang) if copied else "")


def _info(rounds: Sequence[dict], t: Totals, lang: str) -> str:
    """The proposer, the totals, how to read a chip and the legend."""
    greedy, ngram = rounds[-1].get("greedy"), rounds[-1].get("method") == "ngram"
    if ngram:
        look = rounds[-1].get("lookup", {})
        method = "<div>" + said_html(lang, "proposer: {name}, no draft model: each round looks the last n tokens (n "
                                           "from {max_n} down to {min_n}) up earlier in the prompt and answer, and "
                                           "proposes what followed their latest occurrence; steps with no match "
                                           "decode one token plainly", name="<b>" + said_html(lang, "n-gram lookup")
                                     + "</b>", max_n=esc(look.get("max_n", "?")), min_n=esc(look.get("min_n", "?"))) \
            + "</div>"
        hover = gettext(lang, "hover a proposal for where it was copied from and p (the target's probability of it); "
                              "a copy is certain (q = 1), so greedy keeps it when it is the target argmax") if greedy \
            else gettext(lang, "hover a proposal for where it was copied from and p (the target's probability of "
                               "it); a copy is certain (q = 1), so it is kept with probability p")
    else:
        method = ""
        hover = gettext(lang, "hover a proposal for q (the draft's probability of it) and p (the target's); greedy "
                              "keeps it when it is the target argmax") if greedy else \
            gettext(lang, "hover a proposal for q (the draft's probability of it) and p (the target's); kept with "
                          "probability min(1, p/q)")
    rule = gettext(lang, "greedy match") if greedy else \
        gettext(lang, "rejection sampling (keeps the target distribution)")
    line = said_html(lang, "rounds: {rounds} · proposed {proposed} · accepted {accepted} · acceptance rate {rate} · "
                           "{per_pass} tokens per target pass · rule: {rule}", rounds=f"<b>{len(rounds)}</b>",
                     proposed=str(t.proposed), accepted=f"<b>{t.accepted}</b>",
                     rate=f"<b>{percent(lang, t.accepted / max(t.proposed, 1))}</b>",
                     per_pass=number(lang, t.per_pass, 2), rule=esc(rule))
    legend = "".join(f"<span class='tt-chip {cls}'>{esc(gettext(lang, word))}</span>" for cls, word in LEGEND)
    return (f"<div class='tt-lines'>{method}<div>{line}</div><div>{esc(hover)}</div>"
            f"<div class='tt-legend'>{legend}</div></div>")


def spec_html(rounds: Sequence[dict], enabled: bool = True, pieces: Mapping[int, str] | None = None,
              selection: Selection | None = None, picked: int | None = None, hidden_round: bool = False,
              lang: str = "en") -> str:
    """rounds: this request's `spec` events; pieces: token text with special tokens kept;
    selection: the selected pass, named in the header as every panel names it; picked: the
    round (an index of rounds) whose verify step made the token it predicted (its row marked);
    hidden_round: a classroom's cut left that round out (it also drew the hidden token);
    lang: the language of its words."""
    title = gettext(lang, "Speculative decoding")
    if not rounds:
        msg = gettext(lang, "no speculative round yet (rounds start after the first token)") if enabled else \
            gettext(lang, "speculative decoding is off for this request (or the engine has no draft model)")
        return panel(title, empty(msg))
    rows = []
    for i, r in enumerate(rounds[-MAX_ROUNDS:], start=max(0, len(rounds) - MAX_ROUNDS)):
        mark = " class='tt-sel-row'" if i == picked else ""  # the round that made the selected pass's token
        rows.append(f"<tr{mark}><td>{i + 1}</td><td>{r['accepted']}/{r['k']}</td><td>{_chips(r, pieces, lang)}</td>"
                    f"<td>{percent(lang, r['acceptance_rate'])}</td></tr>")
    head = gettext(lang, "copied tokens → target token") if rounds[-1].get("method") == "ngram" else \
        gettext(lang, "draft tokens → target token")
    heads = [gettext(lang, "round"), gettext(lang, "accepted"), head, gettext(lang, "running rate")]
    table = ("<table class='tt-table'><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in heads)
             + "</tr></thead><tbody>" + "".join(reversed(rows)) + "</tbody></table>")
    info = _info(rounds, totals(rounds), lang)
    if selection is None:
        return panel(title, info + table)
    return ('<div class="tt-panel">' + header_html(title, selection)
            + picked_line(selection, picked, len(rounds), hidden_round, lang) + info + table + "</div>")


def picked_line(selection: Selection, picked: int | None, n_rounds: int, hidden_round: bool = False,
                lang: str = "en") -> str:
    """Which round made the selected pass's token, in a line (HTML; "" with no pass selected)."""
    if selection.read is None:
        return ""
    made = selection.token(selection.read + 1)
    if not selection.drew:
        said = said_html(lang, "{token} is the prompt's own token: no round drew it", token=made)
    elif hidden_round:
        said = said_html(lang, "{token} came from a verify step that also drew the hidden token: that round is not "
                               "listed until the reveal", token=made)
    elif picked is None:
        said = said_html(lang, "{token} came from no speculative round (the prefill or a plain decode step)", token=made)
    elif picked >= n_rounds - MAX_ROUNDS:
        said = said_html(lang, "{token} came from round {round}'s verify step (its row marked)", token=made,
                         round=str(picked + 1))
    else:
        said = said_html(lang, "{token} came from round {round}'s verify step (its row marked, older than the {n} "
                               "rounds listed)", token=made, round=str(picked + 1), n=str(MAX_ROUNDS))
    return f"<div class='tt-note'>{said}</div>"
