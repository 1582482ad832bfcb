"""Stage 2: the prefix-cache lookup: which full blocks of the prompt were reused."""
from __future__ import annotations

from visualizers._html import bar, empty, esc, panel


def _badge(hit: bool) -> str:
    return '<span class="tt-badge tt-hit">HIT</span>' if hit else '<span class="tt-badge tt-miss">MISS</span>'


def prefix_cache_html(lookup: dict | None, block_size: int | None = None, usage: dict | None = None,
                      traced: bool = True, ended: bool = False) -> str:
    """lookup: the request's `prefix_cache.lookup` event (None while it waits in the queue);
    usage: the finished request's {"prompt_tokens", "cached_tokens"} (all a request traced at
    level off tells); traced: whether the lookup is traced at all (capture level basic or full);
    ended: the request has finished (one stopped while it waited never had a lookup)."""
    if lookup is None:
        if usage is not None:  # level off: the hit is known from the usage; the blocks are not
            prompt, cached = usage["prompt_tokens"], usage["cached_tokens"]
            skipped = cached / prompt if prompt else 0.0
            rows = [f"{_badge(cached > 0)} (from the finished request's usage)",
                    f"tokens reused: <b>{cached:,}</b> of {prompt:,} prompt tokens",
                    f"prefill skipped: <b>{skipped:.0%}</b> {bar(skipped)}; computed: {prompt - cached:,} tokens",
                    "which blocks were reused is not recorded at capture level off"]
            return panel("Prefix cache", "<div class='tt-lines'>" + "".join(f"<div>{r}</div>" for r in rows)
                         + "</div>")
        if not traced:
            return panel("Prefix cache", empty("capture level off does not trace the lookup: the hit shows "
                                               "here from the usage when the request finishes"))
        if ended:
            return panel("Prefix cache", empty("no lookup: the request ended before the scheduler admitted it"))
        return panel("Prefix cache", empty("waiting for the scheduler to admit the request…"))
    prompt = lookup["prompt_tokens"]
    cached = lookup["cached_tokens"]
    blocks = lookup.get("cached_blocks", [])
    skipped = cached / prompt if prompt else 0.0
    full = int(lookup.get("full_blocks", 0))
    bs = (f" of {block_size} tokens{' each' if full != 1 else ''}") if block_size else ""
    rows = [
        f"{_badge(lookup['hit'])} {'re-admitted after preemption' if lookup.get('readmission') else ''}",
        f"tokens reused: <b>{cached:,}</b> of {prompt:,} prompt tokens",
        (f"blocks reused: <b>{len(blocks)}</b> of {full:,} full prompt block{'s' if full != 1 else ''}{esc(bs)}"
         + (f" (ids {esc(', '.join(map(str, blocks[:24])))}{'…' if len(blocks) > 24 else ''})" if blocks else "")
         if full else  # "0 of 0 full prompt blocks" (G 1400 basic): say why there was nothing to look up
         f"blocks reused: none: the prompt fills no full block{esc(bs.removesuffix(' each'))}, and only full blocks "
         "are cached"),
        f"prefill skipped: <b>{skipped:.0%}</b> {bar(skipped)}; computed now: {prompt - cached:,} tokens",
    ]
    return panel("Prefix cache", "<div class='tt-lines'>" + "".join(f"<div>{r}</div>" for r in rows) + "</div>")
