"""Stage 3: tokenization: each piece with its ID; special and role tokens marked."""
from __future__ import annotations

from typing import Sequence

from visualizers._html import empty, esc, panel, show_piece

MAX_CHIPS = 600  # a very long prompt shows its start and end
MAX_GENERATED = 256  # a long answer shows its newest tokens (the Answer panel has the whole text)


def _chip(tok: dict, generated: bool = False, pos: int | None = None) -> str:
    cls = "tt-chip"
    if tok.get("special"):
        cls += " tt-special"
    if generated:
        cls += " tt-gen"
    text = tok.get("text") if tok.get("text") not in (None, "") else tok.get("piece", "")
    # data-pos: a click selects this position in the attention and logit-lens panels (app/page/hover.js)
    at = f' data-pos="{pos}"' if pos is not None else ""
    where = f"position {pos} · " if pos is not None else ""
    return (f'<span class="{cls}"{at} title="{where}id {esc(tok["id"])} · piece {esc(repr(tok.get("piece", "")))}">'
            f'{show_piece(text)}<sub>{esc(tok["id"])}</sub></span>')


def tokens_html(tokenize: dict | None, generated: Sequence[dict] = (), prompt_tokens: int | None = None,
                missing: str = "") -> str:
    """tokenize: the `tokenize` event; generated: {"id", "text", "special"} per output token;
    prompt_tokens: the prompt's token count when its pieces were not recorded (capture level
    off: from the usage), missing: why they were not."""
    if tokenize is None:
        if not generated:
            return panel("Tokens", empty(missing or "no tokens yet"))
        count = f"<b>{prompt_tokens:,}</b>" if prompt_tokens is not None else "not known yet"
        head = (f"<div class='tt-lines'><div>prompt tokens: {count} · generated: <b>{len(generated):,}</b></div>"
                f"<div class='tt-note'>{esc(missing)}</div></div>" if missing else
                f"<div class='tt-lines'><div>prompt tokens: {count} · generated: <b>{len(generated):,}</b></div></div>")
        legend = '<div class="tt-legend"><span class="tt-chip tt-gen">generated</span></div>'
        return panel("Tokens", head + legend + '<div class="tt-chips">'
                     + "".join(_chip(t, generated=True) for t in generated[-MAX_GENERATED:]) + "</div>")
    toks = tokenize["tokens"]
    n = len(toks)
    idx = list(range(n)) if n <= MAX_CHIPS else list(range(MAX_CHIPS // 2)) + [None] + list(range(n - MAX_CHIPS // 2, n))
    chips = "".join('<span class="tt-chip tt-gap">…</span>' if i is None else _chip(toks[i], pos=i) for i in idx)
    first = max(0, len(generated) - MAX_GENERATED)
    gen = "".join(_chip(t, generated=True, pos=n + first + j) for j, t in enumerate(generated[first:]))
    if len(generated) > MAX_GENERATED:
        gen = f'<span class="tt-chip tt-gap" title="{len(generated) - MAX_GENERATED} earlier generated tokens">…</span>' + gen
    n_special = sum(1 for t in toks if t.get("special"))
    head = (f"<div class='tt-lines'><div>prompt tokens: <b>{tokenize['count']:,}</b> "
            f"({n_special} special) · generated: <b>{len(generated):,}</b>"
            f"{f' (the newest {MAX_GENERATED} shown)' if len(generated) > MAX_GENERATED else ''} · vocabulary: "
            f"<b>{tokenize['vocab_size']:,}</b> logits ({tokenize.get('tokenizer_size', tokenize['vocab_size']):,} "
            f"tokenizer entries) · chat template: {'yes' if tokenize.get('chat_template') else 'no'} · "
            f"tokenized in {tokenize.get('seconds', 0) * 1000:.1f} ms</div></div>")
    legend = ('<div class="tt-legend"><span class="tt-chip tt-special">special / role</span>'
              '<span class="tt-chip">prompt</span><span class="tt-chip tt-gen">generated</span></div>')
    return panel("Tokens", head + legend + f'<div class="tt-chips">{chips}{gen}</div>')
