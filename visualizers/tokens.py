"""Stage 3: tokenization: each piece with its ID; special and role tokens marked."""
from __future__ import annotations

from typing import Sequence

from visualizers._html import empty, esc, panel, show_piece

MAX_CHIPS = 600  # a very long prompt shows its start and end


def _chip(tok: dict, generated: bool = False) -> str:
    cls = "tt-chip"
    if tok.get("special"):
        cls += " tt-special"
    if generated:
        cls += " tt-gen"
    text = tok.get("text") if tok.get("text") not in (None, "") else tok.get("piece", "")
    return (f'<span class="{cls}" title="id {esc(tok["id"])} · piece {esc(repr(tok.get("piece", "")))}">'
            f'{show_piece(text)}<sub>{esc(tok["id"])}</sub></span>')


def tokens_html(tokenize: dict | None, generated: Sequence[dict] = ()) -> str:
    """tokenize: the `tokenize` event; generated: {"id", "text", "special"} per output token."""
    if tokenize is None:
        return panel("Tokens", empty("no tokens yet"))
    toks = tokenize["tokens"]
    shown = toks if len(toks) <= MAX_CHIPS else toks[:MAX_CHIPS // 2] + [None] + toks[-MAX_CHIPS // 2:]
    chips = "".join('<span class="tt-chip tt-gap">…</span>' if t is None else _chip(t) for t in shown)
    gen = "".join(_chip(t, generated=True) for t in generated)
    n_special = sum(1 for t in toks if t.get("special"))
    head = (f"<div class='tt-lines'><div>prompt tokens: <b>{tokenize['count']:,}</b> "
            f"({n_special} special) · generated: <b>{len(generated):,}</b> · vocabulary: "
            f"<b>{tokenize['vocab_size']:,}</b> logits ({tokenize.get('tokenizer_size', tokenize['vocab_size']):,} "
            f"tokenizer entries) · chat template: {'yes' if tokenize.get('chat_template') else 'no'} · "
            f"tokenized in {tokenize.get('seconds', 0) * 1000:.1f} ms</div></div>")
    legend = ('<div class="tt-legend"><span class="tt-chip tt-special">special / role</span>'
              '<span class="tt-chip">prompt</span><span class="tt-chip tt-gen">generated</span></div>')
    return panel("Tokens", head + legend + f'<div class="tt-chips">{chips}{gen}</div>')
