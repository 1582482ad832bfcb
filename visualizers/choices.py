"""n choices from one prompt, side by side: each choice's text as it streams, its token count and
why it stopped. The stages above trace choice 0; the others share its prefilled prompt (their KV
pages point at the same blocks) and draw their own tokens (seed + i when seeded, as vLLM does)."""
from __future__ import annotations

from typing import Sequence

from visualizers._html import esc, panel

WHY = {"stop": "stop", "length": "length (max tokens)", "abort": "aborted"}


def choices_html(choices: Sequence[Sequence[dict]], n: int, hidden: str = "") -> str:
    """choices: each choice's output items so far, choice 0 first; n: how many were asked for.
    One choice: one line (the Answer panel shows it). hidden: a classroom's cut (what each
    column says instead of "streaming": the rest is hidden, not still coming)."""
    if n <= 1:
        return ("<div class='tt-note tt-choices-one'>one choice (n = 1): the answer above. Choices n (under "
                "Penalties, logit bias, JSON mode, n choices) draws up to 4 from one prompt, side by side.</div>")
    cols = []
    for i in range(n):
        outs = list(choices[i]) if i < len(choices) else []
        tokens = sum(1 for o in outs if o.get("token_id", -1) >= 0)
        end = next((o.get("finish_reason") for o in outs if o.get("finished")), None)
        state = f"finished: {WHY.get(end, end)}" if end else hidden or (
            "streaming" if outs else "waiting for its first token")
        text = "".join(o.get("text", "") for o in outs)
        trace = " · traced by every stage above" if i == 0 else ""
        cols.append(f"<div class='tt-choice' data-choice='{i}'><div class='tt-subtitle'>choice {i}{trace}</div>"
                    f"<div class='tt-choice-text'>{esc(text) or '…'}</div>"
                    f"<div class='tt-note'>{tokens:,} token{'s' if tokens != 1 else ''} · {esc(state)}</div></div>")
    note = (f"<div class='tt-lines'>{n} choices from one prompt: it was prefilled once and its KV blocks are shared; "
            "each choice draws its own tokens (with a seed: seed + i for choice i). The stages above trace choice 0."
            "</div>")
    return panel(f"{n} choices", note + f"<div class='tt-choices'>{''.join(cols)}</div>")
