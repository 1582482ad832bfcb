"""What is left of a Chinese lab result's text once the things that stay as written are taken out:
numbers, units, model and setting names, code words (float32, p99, TTFT, KV …), request ids. A
word of English prose left over is an untranslated text."""
from __future__ import annotations

import html
import re

from app.lab.export import figures, headline_rows, sentences_in

KEPT = {"s", "ms", "B", "KiB", "MiB", "GiB", "nats", "float32", "int8", "int4", "p50", "p99", "TTFT", "KV", "CPU",
        "CPUs", "GPU", "NCCL", "top", "KL", "LM", "head", "MoE", "torch", "n", "gram", "ci", "full", "req", "log",
        "embedded", "model", "Linux", "x86_64", "with", "glibc", "B", "SmolLM2", "Gemma",
        "p"}  # (log p(…): a formula)
WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def visible_text(page: str) -> str:
    """An HTML page's text a person reads (no scripts, no styles, no tags)."""
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    page = re.sub(r"<iframe\b[^>]*>", " ", page)
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def figure_texts(figs: list[dict]) -> list[str]:
    """The words a figure shows: titles, axis titles, trace names, categories, hover templates."""
    out = []
    for f in figs:
        lay = f["layout"]
        out += [lay["title"]["text"]] + [lay[a]["title"]["text"] for a in ("xaxis", "yaxis")
                                         if isinstance(lay.get(a), dict) and "title" in lay[a]]
        for t in f["data"]:
            out += [t.get("name") or "", t.get("hovertemplate") or ""]
            out += [x for x in (t.get("x") or []) + (t.get("y") or []) if isinstance(x, str)]
            out += [c for row in (t.get("customdata") or []) if isinstance(row, list) for c in row
                    if isinstance(c, str)]
    return out


def english_words(text: str, allowed: set[str] = frozenset()) -> list[str]:
    """The English words in `text` that are none of KEPT or `allowed` (hover fields %{…} and
    <extra> markup taken out first)."""
    text = re.sub(r"%\{[^}]*\}|<extra>.*?</extra>|<br>|req-[\w-]+|\bexperiment-\w+|\d(\.\d+)?e[-+]?\d+", " ", text)
    return [w for w in WORD.findall(text) if w not in KEPT and w not in allowed]


def left_in_chinese(result: dict, allowed: set[str] = frozenset()) -> list[str]:
    """The English words left in a result drawn in Chinese: its sentences, its table, its figures."""
    header, rows = headline_rows(result, "zh_CN")
    texts = sentences_in(result, "zh_CN") + header + [c for row in rows for c in row]
    texts += figure_texts(figures(result, "zh_CN"))
    ids = {w for st in result["settings"] for r in st["per_request"] for w in english_words(r["request_id"])}
    allowed = {result["model"], *allowed, *ids}  # the requests' ids are names, not prose
    return sorted({w for t in texts for w in english_words(t, allowed)})
