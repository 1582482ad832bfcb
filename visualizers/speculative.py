"""Stage 12: speculative decoding: each round's proposed, accepted and rejected draft
tokens, the bonus (or corrected) token from the target, and the acceptance rate. With
n-gram lookup (no draft model) each round also says where its proposals were copied from."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from visualizers._html import empty, esc, panel, prob, show_piece
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


def span_text(first: int, last: int, prompt_tokens: int) -> str:
    """'tokens 12–15 of the prompt' (plain text): context positions, counted within the
    prompt or within the answer, whichever holds them."""
    if last < prompt_tokens:
        where = "of the prompt"
    elif first >= prompt_tokens:
        first, last, where = first - prompt_tokens, last - prompt_tokens, "of the answer so far"
    else:
        where = "of the prompt + answer"
    return (f"token {first}" if first == last else f"tokens {first}–{last}") + f" {where}"


def copy_source(r: dict) -> str:
    """HTML: where an n-gram round's proposals came from, and the n-gram that matched."""
    src, gram, p = r["copied_from"], r["ngram"], r["prompt_tokens"]
    matched = "".join(f'<span class="tt-chip">{show_piece(t)}</span>' for t in gram["text"])
    return (f"<div class='tt-note'>copied from {esc(span_text(src[0], src[-1], p))}, after the "
            f"{esc(gram['n'])}-gram {matched} at {esc(span_text(gram['start'], gram['start'] + gram['n'] - 1, p))}"
            f"</div>")


def spec_html(rounds: Sequence[dict], enabled: bool = True, pieces: Mapping[int, str] | None = None,
              selection: Selection | None = None, picked: int | None = None, hidden_round: bool = False) -> str:
    """rounds: this request's `spec` events; pieces: token text with special tokens kept;
    selection: the selected pass, named in the header as every panel names it; picked: the
    round (an index of rounds) whose verify step made the token it predicted (its row marked);
    hidden_round: a classroom's cut left that round out (it also drew the hidden token)."""
    if not rounds:
        msg = ("no speculative round yet (rounds start after the first token)" if enabled
               else "speculative decoding is off for this request (or the engine has no draft model)")
        return panel("Speculative decoding", empty(msg))
    t = totals(rounds)
    proposed, accepted = t.proposed, t.accepted
    ngram = rounds[-1].get("method") == "ngram"
    rows = []
    for i, r in enumerate(rounds[-MAX_ROUNDS:], start=max(0, len(rounds) - MAX_ROUNDS)):
        copied = r.get("method") == "ngram"
        chips = []
        for j, text in enumerate(r["proposed_text"]):
            if j < r["accepted"]:
                cls, what = "tt-acc", "accepted"
            elif j == r["accepted"]:
                cls, what = "tt-rej", "rejected"
            else:
                cls, what = "tt-skip", "not checked (after a rejection)"
            q = r["draft_probs"][j] if j < len(r["draft_probs"]) else 0
            p = r["target_probs"][j] if j < len(r["target_probs"]) else 0
            origin = f"copied from position {r['copied_from'][j]}" if copied else f"draft q={prob(q)}"
            chips.append(f'<span class="tt-chip {cls}" title="{esc(what)} · {esc(origin)} · target p={prob(p)}">'
                         f'{show_piece(text)}<sub>{esc(r["proposed"][j])}</sub></span>')
        kind = r["token_kind"]
        if r.get("token") is not None:  # None: the answer ended on an accepted proposal, no token added
            text = r["token_text"] or (pieces or {}).get(r["token"], "")  # special tokens decode to ""
            chips.append(f'<span class="tt-chip tt-{esc(kind)}" title="{esc(kind)} token from the target">'
                         f'{show_piece(text)}<sub>{esc(r["token"])}</sub></span>')
        if r.get("cut_after_end"):
            chips.append(f"<span class='tt-note'>the answer ended here: {esc(r['cut_after_end'])} later "
                         f"proposal{'s' if r['cut_after_end'] > 1 else ''} not counted</span>")
        source = copy_source(r) if copied else ""
        mark = " class='tt-sel-row'" if i == picked else ""  # the round that made the selected pass's token
        rows.append(f"<tr{mark}><td>{i + 1}</td><td>{r['accepted']}/{r['k']}</td><td>{''.join(chips)}{source}</td>"
                    f"<td>{r['acceptance_rate']:.0%}</td></tr>")
    per_pass = t.per_pass
    greedy = rounds[-1].get("greedy")
    if ngram:
        look = rounds[-1].get("lookup", {})
        method = (f"<div>proposer: <b>n-gram lookup</b>, no draft model: each round looks the last n tokens "
                  f"(n from {esc(look.get('max_n', '?'))} down to {esc(look.get('min_n', '?'))}) up earlier in the "
                  "prompt and answer, and proposes what followed their latest occurrence; steps with no match "
                  "decode one token plainly</div>")
        hover = ("hover a proposal for where it was copied from and p (the target's probability of it); a copy is "
                 "certain (q = 1), so " + ("greedy keeps it when it is the target argmax" if greedy
                                           else "it is kept with probability p"))
    else:
        method = ""
        hover = ("hover a proposal for q (the draft's probability of it) and p (the target's)"
                 + ("; greedy keeps it when it is the target argmax" if greedy else "; kept with probability min(1, p/q)"))
    info = (f"<div class='tt-lines'>{method}<div>rounds: <b>{len(rounds)}</b> · proposed {proposed} · accepted "
            f"<b>{accepted}</b> · acceptance rate <b>{accepted / max(proposed, 1):.0%}</b> · "
            f"{per_pass:.2f} tokens per target pass · rule: "
            f"{'greedy match' if greedy else 'rejection sampling (keeps the target distribution)'}"
            f"</div><div>{esc(hover)}</div><div class='tt-legend'><span class='tt-chip tt-acc'>accepted</span>"
            f"<span class='tt-chip tt-rej'>rejected</span><span class='tt-chip tt-skip'>not checked</span>"
            f"<span class='tt-chip tt-bonus'>bonus</span><span class='tt-chip tt-corrected'>corrected</span>"
            f"</div></div>")
    head = "copied tokens → target token" if ngram else "draft tokens → target token"
    table = (f"<table class='tt-table'><thead><tr><th>round</th><th>accepted</th><th>{head}"
             "</th><th>running rate</th></tr></thead><tbody>" + "".join(reversed(rows)) + "</tbody></table>")
    if selection is None:
        return panel("Speculative decoding", info + table)
    return ('<div class="tt-panel">' + header_html("Speculative decoding", selection)
            + picked_line(selection, picked, len(rounds), hidden_round) + info + table + "</div>")


def picked_line(selection: Selection, picked: int | None, n_rounds: int, hidden_round: bool = False) -> str:
    """Which round made the selected pass's token, in a line (HTML; "" with no pass selected)."""
    if selection.read is None:
        return ""
    made = selection.token(selection.read + 1)
    if not selection.drew:
        return f"<div class='tt-note'>{made} is the prompt's own token: no round drew it</div>"
    if hidden_round:
        return (f"<div class='tt-note'>{made} came from a verify step that also drew the hidden token: "
                "that round is not listed until the reveal</div>")
    if picked is None:
        return (f"<div class='tt-note'>{made} came from no speculative round (the prefill or a plain "
                "decode step)</div>")
    where = "" if picked >= n_rounds - MAX_ROUNDS else f", older than the {MAX_ROUNDS} rounds listed"
    return f"<div class='tt-note'>{made} came from round {picked + 1}'s verify step (its row marked{where})</div>"
