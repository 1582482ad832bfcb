"""The chunked-prefill experiment's figures and sentences (app/lab/chunked_prefill.py's result)."""
from __future__ import annotations

from visualizers.lab import bars, distribution, esc, gantt, layout, stream_gaps
from visualizers.lab_verdict import count, seconds, share, span


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
    """The step sizes first (counted, exact), then the stall's and the TTFT's verdicts from the
    repeats' spread (timed: this machine's)."""
    by = {s["setting"]["name"]: s for s in result["settings"]}
    off = by.get("off")
    if off is None:
        return []
    m = off["metrics"]
    out = [f"Without chunking the {m['long_prompt_tokens']}-token prompt was prefilled in one step of "
           f"{count(off, 'max_prefill_tokens_per_step')} tokens, and the biggest step a decoding stream waited on "
           f"held {count(off, 'max_step_tokens_with_streams')} tokens (counted); the streams' longest stall was "
           f"{span(off, 'longest_stall_s', seconds)} (p50 gap {span(off, 'gap_p50_s', seconds)})."]
    for key in ("512", "128"):
        ch = by.get(key)
        if ch is None:
            continue
        stall = share(ch, off, "longest_stall_s", "the longest stall was {pct} of no chunking's", "the longest stall",
                      seconds)
        ttft = share(ch, off, "long_ttft_s", "the long prompt's TTFT was {pct} of no chunking's", "the long TTFT",
                     seconds)
        out.append(f"Chunked at {key} tokens the prompt took {count(ch, 'long_prefill_steps')} steps of prefill and "
                   f"the biggest step a stream waited on held {count(ch, 'max_step_tokens_with_streams')} tokens; "
                   f"{stall}; {ttft}.")
    return out
