"""What of a Chinese page is English prose: the text nodes of its HTML outside token texts
(chips, «quotes», the answer, choices), code and JSON, with the words Chinese keeps in Latin
letters (model facts, flags, units, API names) taken out. Shared by the Controller and the
browser tests of issue 42, item 6."""
from __future__ import annotations

import re
from html.parser import HTMLParser

# elements whose text is a token's, code or JSON, never the page's own words
SKIP_TAGS = {"code", "pre", "sub", "script", "style"}
SKIP_CLASSES = {"tt-chip", "tt-answer", "tt-json", "tt-choice-text", "tt-char", "tt-part", "tt-hex", "tt-run",
                "tt-notext", "tt-amap-r", "tt-amap-c", "tt-tok"}  # the attention map's axes, MoE rows: token labels
# Latin words the Chinese keeps as they are: names of things in code, the API, units, the model's parts
KEPT = {"KV", "MoE", "MLP", "MLA", "ID", "IDs", "logit", "logits", "lens", "RoPE", "SwiGLU", "GeGLU", "Softmax",
        "softmax", "nats", "TTFT", "SSE", "API", "JSON", "OpenAI", "all", "reduce", "to", "d_model", "UTF", "LM",
        "head", "top", "min", "max", "tokens", "off", "basic", "full", "trace_level", "bias", "seed", "stop",
        "length", "abort", "ngram", "draft", "MODEL", "capture", "keys", "float", "float32", "float16", "bfloat16",
        "GiB", "MiB", "KiB", "ms", "BPE", "byte", "level", "FlashAttention", "SDPA", "torch", "Triton", "pydantic", "Sequence", "ForwardBatch", "c_fused", "prompt",
        "lookup", "POST", "completions", "chat", "temperature", "presence_penalty", "frequency_penalty",
        "repetition_penalty", "min_tokens", "logit_bias", "finish_reason", "usage", "max_tokens", "gram", "argmax",
        "hidden", "vocab", "Llama"}  # (Llama: the reference model the parallelism panel quotes)


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.skipping: list[bool] = []
        self.parts: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        if tag in ("br", "img", "input", "hr", "meta", "link", "wbr"):
            return
        classes = set((dict(attrs).get("class") or "").split())
        self.skipping.append(tag in SKIP_TAGS or bool(classes & SKIP_CLASSES) or any(self.skipping[-1:]))

    def handle_endtag(self, tag) -> None:
        if tag not in ("br", "img", "input", "hr", "meta", "link", "wbr") and self.skipping:
            self.skipping.pop()

    def handle_data(self, data) -> None:
        if not any(self.skipping[-1:]):
            self.parts.append(data)


def page_text(html: str) -> str:
    """The text nodes a reader sees, outside tokens, code and JSON."""
    p = _Text()
    p.feed(html)
    return " ".join(p.parts)


def english(html: str, names: set[str] = frozenset()) -> list[str]:
    """The English words left in html's prose (names: more words kept, e.g. the model's name)."""
    # quoted tokens, flags, request ids, shapes ([5 × hidden])
    text = re.sub(r"«[^»]*»|'[^']*'|\"[^\"]*\"|--[\w-]+|req-[\w-]+|\[[^\]]*\]", " ", page_text(html))
    words = re.findall(r"[A-Za-z][A-Za-z_]{2,}", text)
    # a word with an underscore is an identifier (scaled_dot_product_attention, cpu_moe.c): code, not prose
    return [w for w in words if w not in KEPT and w not in names and "_" not in w
            and not re.fullmatch(r"[A-Z][A-Z0-9_]+", w)]
