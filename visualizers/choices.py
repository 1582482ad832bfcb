"""n choices from one prompt, side by side: each choice's text as it streams, its token count and
why it stopped. The stages above trace choice 0; the others share its prefilled prompt (their KV
pages point at the same blocks) and draw their own tokens (seed + i when seeded, as vLLM does)."""
from __future__ import annotations

from typing import Sequence

from visualizers import i18n
from visualizers._html import esc, panel, said_html, said_html_n

WHY = {"stop": i18n.N_("stop"), "length": i18n.N_("length (max tokens)"), "abort": i18n.N_("aborted")}


def choices_html(choices: Sequence[Sequence[dict]], n: int, hidden: str = "", lang: str = i18n.DEFAULT) -> str:
    """choices: each choice's output items so far, choice 0 first; n: how many were asked for.
    One choice: one line (the Answer panel shows it). hidden: a classroom's cut (what each
    column says instead of "streaming": the rest is hidden, not still coming)."""
    if n <= 1:
        return ("<div class='tt-note tt-choices-one'>" + said_html(
            lang, "one choice (n = 1): the answer above. Choices n (under Penalties, logit bias, JSON mode, n choices) "
                  "draws up to 4 from one prompt, side by side.") + "</div>")
    cols = []
    for i in range(n):
        outs = list(choices[i]) if i < len(choices) else []
        tokens = sum(1 for o in outs if o.get("token_id", -1) >= 0)
        end = next((o.get("finish_reason") for o in outs if o.get("finished")), None)
        why = i18n.gettext(lang, WHY[end]) if end in WHY else str(end)
        state = i18n.gettext(lang, "finished: {why}", why=why) if end else hidden or (
            i18n.gettext(lang, "streaming") if outs else i18n.gettext(lang, "waiting for its first token"))
        text = "".join(o.get("text", "") for o in outs)
        name = said_html(lang, "choice {i} · traced by every stage above", i=str(i)) if i == 0 else \
            said_html(lang, "choice {i}", i=str(i))
        count = said_html_n(lang, "{n} token", "{n} tokens", tokens)
        cols.append(f"<div class='tt-choice' data-choice='{i}'><div class='tt-subtitle'>{name}</div>"
                    f"<div class='tt-choice-text'>{esc(text) or '…'}</div>"
                    f"<div class='tt-note'>{count} · {esc(state)}</div></div>")
    note = ("<div class='tt-lines'>" + said_html(
        lang, "{n} choices from one prompt: it was prefilled once and its KV blocks are shared; each choice draws its "
              "own tokens (with a seed: seed + i for choice i). The stages above trace choice 0.", n=str(n)) + "</div>")
    return panel(i18n.gettext(lang, "{n} choices", n=str(n)), note + f"<div class='tt-choices'>{''.join(cols)}</div>")
