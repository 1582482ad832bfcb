"""Stage 3: tokenization: each piece with its ID; special and role tokens marked."""
from __future__ import annotations

import functools
from typing import Sequence

from visualizers import i18n
from visualizers._html import bold, empty, esc, panel, said_html, show_piece
from visualizers.char_runs import cjk_note, is_word, label_title, piece_text, run_html
from visualizers.token_chars import group

MAX_CHIPS = 600  # a very long prompt shows its start and end
MAX_GENERATED = 256  # a long answer shows its newest tokens (the Answer panel has the whole text)


def _chip(tok: dict, generated: bool = False, pos: int | None = None, inner: str | None = None,
          more: str = "", word: bool = False, lang: str = i18n.DEFAULT) -> str:
    """inner: the chip's text as HTML (a piece inside a run of split characters: its bytes);
    more: what the hover adds (its bytes, the characters they belong to); word: a token of
    several whole Chinese characters (marked)."""
    cls = "tt-chip" + (" tt-word" if word else "")
    if tok.get("special"):
        cls += " tt-special"
    if generated:
        cls += " tt-gen"
    text = _text(tok)
    # data-pos: a click selects this position in the attention and logit-lens panels (app/page/hover.js)
    at = f' data-pos="{pos}"' if pos is not None else ""
    where = i18n.gettext(lang, "position {p} · ", p=str(pos)) if pos is not None else ""
    what = i18n.gettext(lang, "id {id} · piece {piece}", id=str(tok["id"]), piece=repr(tok.get("piece", "")))
    return (f'<span class="{cls}"{at} title="{esc(where)}{esc(what)}'
            f'{esc(more) if more else ""}">'
            f'{show_piece(text) if inner is None else inner}<sub>{esc(tok["id"])}</sub></span>')


def _text(tok: dict) -> str:
    return tok.get("text") if tok.get("text") not in (None, "") else tok.get("piece", "")


def chips_html(toks: Sequence[dict], shown: Sequence[int | None], n_prompt: int, lang: str = i18n.DEFAULT) -> str:
    """The chips of toks (prompt then generated) at the indexes shown (None: the gap of a long
    list); tokens tied by a character split into byte pieces drawn as one run under that
    character. n_prompt: the first generated token's index."""
    labels = [_text(t) for t in toks]
    if not any("<0x" in label for label in labels):  # no piece of a character (all English): no grouping
        return "".join('<span class="tt-chip tt-gap">…</span>' if i is None else
                       _chip(toks[i], generated=i >= n_prompt, pos=toks[i].get("pos", i), word=is_word(labels[i]),
                             lang=lang) for i in shown)
    runs, run_of = group(labels, [bool(t.get("special")) for t in toks])
    out, done = [], set()
    for i in shown:
        if i is None:
            out.append('<span class="tt-chip tt-gap">…</span>')
            continue
        run = runs[run_of[i]]
        if run.first in done:
            continue
        if not run.joined and all(c.valid for c in run.chars):
            out.append(_chip(toks[i], generated=i >= n_prompt, pos=toks[i].get("pos", i), word=is_word(labels[i]),
                             lang=lang))
            continue
        done.add(run.first)
        chips = [_chip(toks[j], generated=j >= n_prompt, pos=toks[j].get("pos", j), inner=piece_text(run, j),
                       more=" · " + label_title(labels, j, lang=lang), lang=lang)
                 for j in range(run.first, run.last + 1)]
        out.append(run_html(run, chips, lang))
    return "".join(out)


def id_prompt(body: dict | None) -> list[int] | None:
    """A completion body's prompt of token ids (OpenAI's [int], or its batch of one), else None."""
    prompt = (body or {}).get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    return prompt if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt) else None


def tokens_html(tokenize: dict | None, generated: Sequence[dict] = (), prompt_tokens: int | None = None,
                missing: str = "", lang: str = i18n.DEFAULT, ids_sent: bool = False) -> str:
    """tokenize: the `tokenize` event; generated: {"id", "text", "special"} per output token;
    prompt_tokens: the prompt's token count when its pieces were not recorded (capture level
    off: from the usage), missing: why they were not (in lang); ids_sent: the client sent the
    prompt as token ids (id_prompt), so no tokenizer ran: the time is their reading."""
    title = i18n.gettext(lang, "Tokens")
    gen_word = said_html(lang, "generated")
    if tokenize is None:
        if not generated:
            return panel(title, empty(missing or i18n.gettext(lang, "no tokens yet")))
        count = f"<b>{i18n.number(lang, prompt_tokens)}</b>" if prompt_tokens is not None else \
            said_html(lang, "not known yet")
        line = said_html(lang, "prompt tokens: {count} · generated: {generated}", count=count,
                         generated=bold(i18n.number(lang, len(generated))))
        head = (f"<div class='tt-lines'><div>{line}</div>"
                + (f"<div class='tt-note'>{esc(missing)}</div>" if missing else "") + "</div>")
        legend = f'<div class="tt-legend"><span class="tt-chip tt-gen">{gen_word}</span></div>'
        return panel(title, head + legend + '<div class="tt-chips">'
                     + "".join(_chip(t, generated=True, lang=lang) for t in generated[-MAX_GENERATED:]) + "</div>")
    toks = tokenize["tokens"]
    n = len(toks)
    idx = list(range(n)) if n <= MAX_CHIPS else list(range(MAX_CHIPS // 2)) + [None] + list(range(n - MAX_CHIPS // 2, n))
    first = max(0, len(generated) - MAX_GENERATED)
    chips = chips_html(toks, idx, n, lang)
    gen = chips_html([{**t, "pos": n + first + j} for j, t in enumerate(generated[first:])],
                     range(len(generated) - first), 0, lang)
    if len(generated) > MAX_GENERATED:
        earlier = i18n.gettext(lang, "{n} earlier generated tokens", n=str(len(generated) - MAX_GENERATED))
        gen = f'<span class="tt-chip tt-gap" title="{esc(earlier)}">…</span>' + gen
    legend = ('<div class="tt-legend"><span class="tt-chip tt-special">' + said_html(lang, "special / role")
              + '</span><span class="tt-chip">' + said_html(lang, "prompt") + '</span><span class="tt-chip tt-gen">'
              + gen_word + '</span></div>')
    note = cjk_note([_text(t) for t in toks], [bool(t.get("special")) for t in toks], lang)
    return panel(title, _head(tokenize, toks, len(generated), lang, ids_sent) + note + legend
                 + f'<div class="tt-chips">{chips}{gen}</div>')


def _head(tokenize: dict, toks: Sequence[dict], generated: int, lang: str, ids_sent: bool = False) -> str:
    """The counts line: prompt tokens, generated, the vocabulary, the template, the time (to
    tokenize the prompt, or to read the ids a client sent)."""
    num = functools.partial(i18n.number, lang)
    newest = said_html(lang, " (the newest {n} shown)", n=str(MAX_GENERATED)) if generated > MAX_GENERATED else ""
    line = said_html(
        lang, "prompt tokens: {count} ({special} special) · generated: {generated}{newest} · vocabulary: {vocab} logits "
              "({entries} tokenizer entries) · chat template: {template} · {took}",
        count=bold(num(tokenize['count'])), special=str(sum(1 for t in toks if t.get("special"))),
        generated=bold(num(generated)), newest=newest, vocab=bold(num(tokenize['vocab_size'])),
        entries=num(tokenize.get('tokenizer_size', tokenize['vocab_size'])),
        template=said_html(lang, "yes") if tokenize.get("chat_template") else said_html(lang, "no"),
        took=_took(tokenize, lang, ids_sent))
    return f"<div class='tt-lines'><div>{line}</div></div>"


def _took(tokenize: dict, lang: str, ids_sent: bool) -> str:
    ms = esc(i18n.number(lang, tokenize.get("seconds", 0) * 1000, 1))
    if ids_sent:
        return said_html(lang, "ids read in {ms} ms (no tokenizer ran: the client sent them)", ms=ms)
    return said_html(lang, "tokenized in {ms} ms", ms=ms)
