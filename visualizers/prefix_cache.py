"""Stage 2: the prefix-cache lookup: which full blocks of the prompt were reused."""
from __future__ import annotations

from visualizers._html import bar, empty, esc, panel


def prefix_cache_html(lookup: dict | None, block_size: int | None = None) -> str:
    """lookup: the request's `prefix_cache.lookup` event (None while it waits in the queue)."""
    if lookup is None:
        return panel("Prefix cache", empty("waiting for the scheduler to admit the request…"))
    prompt = lookup["prompt_tokens"]
    cached = lookup["cached_tokens"]
    blocks = lookup.get("cached_blocks", [])
    status = ('<span class="tt-badge tt-hit">HIT</span>' if lookup["hit"]
              else '<span class="tt-badge tt-miss">MISS</span>')
    skipped = cached / prompt if prompt else 0.0
    bs = f" of {block_size} tokens each" if block_size else ""
    rows = [
        f"{status} {'re-admitted after preemption' if lookup.get('readmission') else ''}",
        f"tokens reused: <b>{cached:,}</b> of {prompt:,} prompt tokens",
        f"blocks reused: <b>{len(blocks)}</b> of {lookup.get('full_blocks', 0)} full prompt blocks{esc(bs)}"
        + (f" (ids {esc(', '.join(map(str, blocks[:24])))}{'…' if len(blocks) > 24 else ''})" if blocks else ""),
        f"prefill skipped: <b>{skipped:.0%}</b> {bar(skipped)}; computed now: {prompt - cached:,} tokens",
    ]
    return panel("Prefix cache", "<div class='tt-lines'>" + "".join(f"<div>{r}</div>" for r in rows) + "</div>")
