"""The glossary (glossary.json) as data: the article's terms, English -> Chinese, read by the
translators, the catalog tests and the docs page."""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path


@cache
def terms() -> list[dict]:
    """[{"en", "zh", "note", "check"}], in the order the journey meets them."""
    return json.loads(Path(__file__).with_name("glossary.json").read_text(encoding="utf-8"))["terms"]


def markdown_table() -> str:
    """The glossary as a Markdown table (the docs page's)."""
    rows = [f"| {t['en']} | {t['zh']} | {t['note']} |" for t in terms()]
    return "\n".join(["| English | 中文 | note |", "|---|---|---|", *rows])
