"""Stages 9-10: the streamed answer with per-token timing; the stop reason and usage."""
from __future__ import annotations

from typing import Sequence

from visualizers._html import esc, fmt_ms, panel, show_piece


def answer_html(tokens: Sequence[dict], finish: dict | None = None, error: str | None = None) -> str:
    """tokens: {"index", "token_id", "text", "t" (s since arrival), "latency"} per streamed token."""
    text = "".join(t["text"] for t in tokens)
    if finish is not None and finish.get("text") is not None:
        text = finish["text"]
    lat = [t["latency"] for t in tokens]
    peak = max(lat[1:], default=0) or 1
    chips = "".join(
        f'<span class="tt-chip tt-timed" title="token {t["index"]} · id {t["token_id"]} · at {t["t"] * 1000:.0f} ms'
        f' · +{t["latency"] * 1000:.1f} ms"><span class="tt-lat" style="height:{min(1, t["latency"] / peak) * 100:.0f}%">'
        f'</span>{show_piece(t["text"]) if t["text"] else "·"}</span>' for t in tokens[-200:])
    stats = []
    if tokens:
        stats.append(f"tokens: <b>{len(tokens)}</b>")
        stats.append(f"first token at <b>{fmt_ms(tokens[0]['t'])}</b>")
        if len(tokens) > 1:
            span = tokens[-1]["t"] - tokens[0]["t"]
            stats.append(f"then {fmt_ms(span / (len(tokens) - 1))} per token "
                         f"({(len(tokens) - 1) / span if span > 0 else 0:.1f} tokens/s)")
    if finish is not None:
        u = finish.get("usage", {})
        stats.append(f"finished: <b>{esc(finish.get('reason'))}</b> · usage: {u.get('prompt_tokens', 0)} prompt + "
                     f"{u.get('completion_tokens', 0)} completion ({u.get('cached_tokens', 0)} cached)")
    err = f"<div class='tt-err'>{esc(error)}</div>" if error else ""
    status = "" if finish or error else "<span class='tt-live'>● streaming</span>"
    return panel("Answer", f"{err}<div class='tt-answer'>{esc(text)}{status}</div>"
                 f"<div class='tt-lines'><div>{' · '.join(stats)}</div></div>"
                 f"<div class='tt-chips tt-timing'>{chips}</div>")
