"""What a streaming handler's updates must carry again: Gradio streams a generator's outputs as
diffs, and the browser applies each diff in place to one object per output, the same object it
handed to the component for the update before (gradio/templates/frontend: Tt/Et/Dt). An update
dict sent in one yield and left out of the next is deleted from that object by the next diff; a
browser that had not applied the first yet (a busy tab, a slow phone) never sees it. Seen: Stop
bright red after a fast answer had finished (its "secondary" came one yield before the last,
which left it out), in 10 of 16 sends at 6x CPU throttling. Carrying the last update of those
outputs in every later yield makes their diff empty: nothing is deleted."""
from __future__ import annotations

from typing import Iterator

import gradio as gr

# the outputs whose update dicts are carried: Stop's look (re-applied by the browser at every yield, as
# any carried update is: a stage's section carried so re-rendered its panels ten times a second, and
# benchmarks.measure's token lag doubled)
CARRIED = ("stop",)
CARRIED_PREFIXES: tuple[str, ...] = ()


def carried(name: str) -> bool:
    return name in CARRIED or name.startswith(CARRIED_PREFIXES)


def carry(updates: Iterator[dict]) -> Iterator[dict]:
    """updates with each CARRIED output's last update dict in every later yield too (closing
    this closes updates: a handler's cleanup runs when the page cancels it)."""
    kept: dict[str, dict] = {}
    try:
        for out in updates:
            kept.update({n: v for n, v in out.items() if isinstance(v, dict) and carried(n)})
            yield {**kept, **out}
    finally:
        close = getattr(updates, "close", None)
        if close is not None:
            close()


def merged(*parts: dict) -> dict:
    """Several {name: value or update} dicts as one (a value and an update of one output
    become one update)."""
    out: dict = {}
    for part in parts:
        for name, val in part.items():
            if name in out and (isinstance(out[name], dict) or isinstance(val, dict)):
                old = out[name] if isinstance(out[name], dict) else gr.update(value=out[name])
                val = {**old, **(val if isinstance(val, dict) else {"value": val})}
            out[name] = val
    return out
