"""Stage 2: the prefix-cache lookup: which full blocks of the prompt were reused."""
from __future__ import annotations

from visualizers import i18n
from visualizers._html import bar, bold, empty, esc, panel, said_html


def _badge(hit: bool, lang: str) -> str:
    hit_word, miss_word = said_html(lang, "HIT"), said_html(lang, "MISS")
    return f'<span class="tt-badge tt-hit">{hit_word}</span>' if hit else f'<span class="tt-badge tt-miss">{miss_word}</span>'


def prefix_cache_html(lookup: dict | None, block_size: int | None = None, usage: dict | None = None,
                      traced: bool = True, ended: bool = False, lang: str = i18n.DEFAULT) -> str:
    """lookup: the request's `prefix_cache.lookup` event (None while it waits in the queue);
    usage: the finished request's {"prompt_tokens", "cached_tokens"} (all a request traced at
    level off tells); traced: whether the lookup is traced at all (capture level basic or full);
    ended: the request has finished (one stopped while it waited never had a lookup)."""
    title = i18n.gettext(lang, "Prefix cache")
    if lookup is None:
        if usage is not None:  # level off: the hit is known from the usage; the blocks are not
            prompt, cached = usage["prompt_tokens"], usage["cached_tokens"]
            skipped = cached / prompt if prompt else 0.0
            rows = [_badge(cached > 0, lang) + " " + said_html(lang, "(from the finished request's usage)"),
                    _reused(lang, cached, prompt), _skipped(lang, skipped, prompt - cached, False),
                    said_html(lang, "which blocks were reused is not recorded at capture level off")]
            return panel(title, "<div class='tt-lines'>" + "".join(f"<div>{r}</div>" for r in rows) + "</div>")
        if not traced:
            return panel(title, empty(i18n.gettext(lang, "capture level off does not trace the lookup: the hit shows "
                                                         "here from the usage when the request finishes")))
        if ended:
            return panel(title, empty(i18n.gettext(lang, "no lookup: the request ended before the scheduler "
                                                         "admitted it")))
        return panel(title, empty(i18n.gettext(lang, "waiting for the scheduler to admit the request…")))
    prompt = lookup["prompt_tokens"]
    cached = lookup["cached_tokens"]
    skipped = cached / prompt if prompt else 0.0
    again = said_html(lang, "re-admitted after preemption") if lookup.get("readmission") else ""
    rows = [f"{_badge(lookup['hit'], lang)} {again}", _reused(lang, cached, prompt),
            _blocks(lookup, block_size, lang), _skipped(lang, skipped, prompt - cached, True)]
    return panel(title, "<div class='tt-lines'>" + "".join(f"<div>{r}</div>" for r in rows) + "</div>")


def _reused(lang: str, cached: int, prompt: int) -> str:
    return said_html(lang, "tokens reused: {cached} of {prompt} prompt tokens",
                     cached=bold(i18n.number(lang, cached)), prompt=i18n.number(lang, prompt))


def _skipped(lang: str, skipped: float, computed: int, now: bool) -> str:
    values = {"share": f"<b>{esc(i18n.percent(lang, skipped))}</b>", "bar": bar(skipped),
              "computed": i18n.number(lang, computed)}
    if now:
        return said_html(lang, "prefill skipped: {share} {bar}; computed now: {computed} tokens", **values)
    return said_html(lang, "prefill skipped: {share} {bar}; computed: {computed} tokens", **values)


def _blocks(lookup: dict, block_size: int | None, lang: str) -> str:
    """Which full blocks of the prompt were reused (or why there were none to look up)."""
    blocks = lookup.get("cached_blocks", [])
    full = int(lookup.get("full_blocks", 0))
    if not full:  # "0 of 0 full prompt blocks" (G 1400 basic): say why there was nothing to look up
        if block_size:
            return said_html(lang, "blocks reused: none: the prompt fills no full block of {size} tokens, and only "
                                   "full blocks are cached", size=str(block_size))
        return said_html(lang, "blocks reused: none: the prompt fills no full block, and only full blocks are cached")
    ids = ""
    if blocks:
        ids = said_html(lang, " (ids {ids})", ids=esc(', '.join(map(str, blocks[:24]))) + ('…' if len(blocks) > 24
                                                                                          else ''))
    values = {"reused": f"<b>{len(blocks)}</b>", "full": i18n.number(lang, full), "size": str(block_size)}
    if not block_size:
        return said_html(lang, "blocks reused: {reused} of {full} full prompt blocks", **values) + ids if full != 1 \
            else said_html(lang, "blocks reused: {reused} of {full} full prompt block", **values) + ids
    if full != 1:
        return said_html(lang, "blocks reused: {reused} of {full} full prompt blocks of {size} tokens each",
                         **values) + ids
    return said_html(lang, "blocks reused: {reused} of {full} full prompt block of {size} tokens", **values) + ids
