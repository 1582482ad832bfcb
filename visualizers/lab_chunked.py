"""The chunked-prefill experiment's figures and sentences (app/lab/chunked_prefill.py's result),
in a language (visualizers.i18n)."""
from __future__ import annotations

from visualizers import i18n
from visualizers.i18n import N_, gettext
from visualizers.lab import bars, distribution, esc, gantt, layout, stream_gaps
from visualizers.lab_verdict import count, seconds, share, span
from visualizers.lab_words import hover, word


def figures(result: dict, lang: str = i18n.DEFAULT) -> list[dict]:
    settings = result["settings"]
    if not settings:
        return []
    gaps = stream_gaps(settings)
    return [bars(settings, (("longest_stall_s", N_("longest stall"), "s"), ("gap_p99_s", N_("gap p99"), "s"),
                            ("long_ttft_s", N_("long prompt TTFT"), "s")),
                 N_("Stalls of the streams against the long TTFT"), lang),
            distribution(gaps, N_("The streams' gaps between tokens"), lang=lang),
            prefill_per_step(settings, lang)] + [gantt(s, lang=lang) for s in settings]


def prefill_per_step(settings: list[dict], lang: str = i18n.DEFAULT) -> dict:
    """Tokens each step prefilled (bars) per setting: the chunk is the ceiling."""
    data = [{"type": "bar", "name": esc(word(lang, s["setting"]["label"])),
             "x": [st["step"] - s["steps"][0]["step"] + 1 for st in s["steps"]],
             "y": [st["prefill_tokens"] for st in s["steps"]],
             "customdata": [[st["step"], st["decode_tokens"], st["seconds"] * 1000] for st in s["steps"]],
             "hovertemplate": hover(lang, N_("step %{customdata[0]}: %{y} tokens prefilled, %{customdata[1]} decoded, "
                                          "%{customdata[2]:.2f} ms<extra>%{fullData.name}</extra>"))}
            for s in settings]
    return {"data": data, "layout": layout(gettext(lang, "Tokens prefilled in each step"), barmode="group",
                                           xaxis={"title": {"text": gettext(lang, "step of the workload")}},
                                           yaxis={"title": {"text": gettext(lang, "prefill tokens")}})}


def sentences(result: dict, lang: str = i18n.DEFAULT) -> list[str]:
    """The step sizes first (counted, exact), then the stall's and the TTFT's verdicts from the
    repeats' spread (timed: this machine's)."""
    by = {s["setting"]["name"]: s for s in result["settings"]}
    off = by.get("off")
    if off is None:
        return []
    m = off["metrics"]
    out = [gettext(lang, "Without chunking the {tokens}-token prompt was prefilled in one step of {most} tokens, and "
                         "the biggest step a decoding stream waited on held {biggest} tokens (counted); the streams' "
                         "longest stall was {stall} (p50 gap {p50}).", tokens=m["long_prompt_tokens"],
                   most=count(off, "max_prefill_tokens_per_step", lang),
                   biggest=count(off, "max_step_tokens_with_streams", lang),
                   stall=span(off, "longest_stall_s", seconds), p50=span(off, "gap_p50_s", seconds))]
    for key in ("512", "128"):
        ch = by.get(key)
        if ch is None:
            continue
        stall = share(ch, off, "longest_stall_s", N_("the longest stall was {pct} of no chunking's"),
                      N_("the longest stall"), seconds, lang)
        ttft = share(ch, off, "long_ttft_s", N_("the long prompt's TTFT was {pct} of no chunking's"),
                     N_("the long TTFT"), seconds, lang)
        out.append(gettext(lang, "Chunked at {chunk} tokens the prompt took {steps} steps of prefill and the biggest "
                                 "step a stream waited on held {biggest} tokens; {stall}; {ttft}.", chunk=key,
                           steps=count(ch, "long_prefill_steps", lang),
                           biggest=count(ch, "max_step_tokens_with_streams", lang), stall=stall, ttft=ttft))
    return out
