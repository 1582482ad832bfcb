"""Stage 12: speculative decoding: each round's proposed, accepted and rejected draft
tokens, the bonus (or corrected) token from the target, and the acceptance rate."""
from __future__ import annotations

from typing import Mapping, Sequence

from visualizers._html import empty, esc, panel, show_piece

MAX_ROUNDS = 12


def spec_html(rounds: Sequence[dict], enabled: bool = True, pieces: Mapping[int, str] | None = None) -> str:
    """rounds: this request's `spec` events; pieces: token text with special tokens kept."""
    if not rounds:
        msg = ("no speculative round yet (rounds start after the first token)" if enabled
               else "speculative decoding is off for this request (or the engine has no draft model)")
        return panel("Speculative decoding", empty(msg))
    proposed = sum(r["k"] for r in rounds)
    accepted = sum(r["accepted"] for r in rounds)
    rows = []
    for i, r in enumerate(rounds[-MAX_ROUNDS:], start=max(0, len(rounds) - MAX_ROUNDS)):
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
            chips.append(f'<span class="tt-chip {cls}" title="{what} · draft q={q:.3f} · target p={p:.3f}">'
                         f'{show_piece(text)}<sub>{esc(r["proposed"][j])}</sub></span>')
        kind = r["token_kind"]
        text = r["token_text"] or (pieces or {}).get(r["token"], "")  # special tokens decode to ""
        chips.append(f'<span class="tt-chip tt-{kind}" title="{kind} token from the target">'
                     f'{show_piece(text)}<sub>{esc(r["token"])}</sub></span>')
        rows.append(f"<tr><td>{i + 1}</td><td>{r['accepted']}/{r['k']}</td><td>{''.join(chips)}</td>"
                    f"<td>{r['acceptance_rate']:.0%}</td></tr>")
    per_pass = (accepted + len(rounds)) / len(rounds)
    info = (f"<div class='tt-lines'><div>rounds: <b>{len(rounds)}</b> · proposed {proposed} · accepted "
            f"<b>{accepted}</b> · acceptance rate <b>{accepted / max(proposed, 1):.0%}</b> · "
            f"{per_pass:.2f} tokens per target pass · rule: "
            f"{'greedy match' if rounds[-1].get('greedy') else 'rejection sampling (keeps the target distribution)'}"
            f"</div><div>hover a proposal for q (the draft's probability of it) and p (the target's)"
            f"{'; greedy keeps it when it is the target argmax' if rounds[-1].get('greedy') else '; kept with probability min(1, p/q)'}"
            f"</div><div class='tt-legend'><span class='tt-chip tt-acc'>accepted</span>"
            f"<span class='tt-chip tt-rej'>rejected</span><span class='tt-chip tt-skip'>not checked</span>"
            f"<span class='tt-chip tt-bonus'>bonus</span><span class='tt-chip tt-corrected'>corrected</span>"
            f"</div></div>")
    table = ("<table class='tt-table'><thead><tr><th>round</th><th>accepted</th><th>draft tokens → target token"
             "</th><th>running rate</th></tr></thead><tbody>" + "".join(reversed(rows)) + "</tbody></table>")
    return panel("Speculative decoding", info + table)
