"""The chunked-prefill experiment's figures and sentences (app/lab/chunked_prefill.py's result)."""
from __future__ import annotations

from visualizers.lab import bars, distribution, esc, gantt, layout, stream_gaps


def figures(result: dict) -> list[dict]:
    settings = result["settings"]
    if not settings:
        return []
    gaps = stream_gaps(settings)
    return [bars(settings, (("longest_stall_s", "longest stall", "s"), ("gap_p99_s", "gap p99", "s"),
                            ("long_ttft_s", "long prompt TTFT", "s")), "Stalls of the streams against the long TTFT"),
            distribution(gaps, "The streams' gaps between tokens"),
            prefill_per_step(settings)] + [gantt(s) for s in settings]


def prefill_per_step(settings: list[dict]) -> dict:
    """Tokens each step prefilled (bars) per setting: the chunk is the ceiling."""
    data = [{"type": "bar", "name": esc(s["setting"]["label"]), "x": [st["step"] - s["steps"][0]["step"] + 1
                                                                     for st in s["steps"]],
             "y": [st["prefill_tokens"] for st in s["steps"]],
             "customdata": [[st["step"], st["decode_tokens"], st["seconds"] * 1000] for st in s["steps"]],
             "hovertemplate": "step %{customdata[0]}: %{y} tokens prefilled, %{customdata[1]} decoded, "
                              "%{customdata[2]:.2f} ms<extra>%{fullData.name}</extra>"}
            for s in settings]
    return {"data": data, "layout": layout("Tokens prefilled in each step", barmode="group",
                                           xaxis={"title": {"text": "step of the workload"}},
                                           yaxis={"title": {"text": "prefill tokens"}})}


def sentences(result: dict) -> list[str]:
    by = {s["setting"]["name"]: s["metrics"] for s in result["settings"]}
    off = by.get("off")
    if off is None:
        return []
    out = [f"Without chunking the {off['long_prompt_tokens']}-token prompt was prefilled in one step of "
           f"{off['max_prefill_tokens_per_step']} tokens, and the decoding streams' longest stall was "
           f"{_ms(off['longest_stall_s'])} (p50 gap {_ms(off['gap_p50_s'])})."]
    for key in ("512", "128"):
        m = by.get(key)
        if m is None:
            continue
        ttft = (m["long_ttft_s"] / off["long_ttft_s"] - 1) * 100 if off["long_ttft_s"] else 0.0
        out.append(f"Chunked at {key} tokens ({m['long_prefill_steps']} steps of prefill), the longest stall "
                   f"went from {_ms(off['longest_stall_s'])} to {_ms(m['longest_stall_s'])} and the long "
                   f"prompt's TTFT {'rose' if ttft >= 0 else 'fell'} by {abs(ttft):.0f}% "
                   f"({_ms(off['long_ttft_s'])} → {_ms(m['long_ttft_s'])}).")
    return out


def _ms(s: float | None) -> str:
    return "–" if s is None else f"{s * 1000:.0f} ms" if s >= 0.01 else f"{s * 1000:.1f} ms"
