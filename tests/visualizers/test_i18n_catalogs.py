"""The catalogs (issue 42): every text in English and Simplified Chinese with the same named
placeholders, translated, up to date with the code, the glossary's terms kept; the language a
browser gets (?lang=, the switch's cookie, Accept-Language); numbers written for the language."""
from __future__ import annotations

import re

import pytest
from babel.messages.pofile import read_po

from tests.paths import ROOT
from visualizers import i18n
from visualizers.i18n import glossary
from visualizers.i18n.catalog import LANGS, LOCALES, po_path
from visualizers.i18n.extract import template

FIELD = re.compile(r"\{(\w*)[^{}]*\}")


def entries(lang: str) -> dict:
    with po_path(lang).open("rb") as f:
        return {m.id: m for m in read_po(f, locale=lang) if m.id}


def fields(text: str) -> set[str]:
    return set(FIELD.findall(text or ""))


def test_every_entry_is_in_both_languages_with_the_same_placeholders():
    en, zh = entries("en"), entries("zh_CN")
    assert set(en) == set(zh), set(en) ^ set(zh)
    bad = []
    for msgid, m in zh.items():
        ids = msgid if isinstance(msgid, tuple) else (msgid,)
        want = set().union(*(fields(i) for i in ids))
        forms = m.string if isinstance(m.string, tuple) else (m.string,)
        bad += [(msgid, f) for f in forms if f and fields(f) != want]
        if isinstance(msgid, tuple):  # Chinese has one plural form: its {n} must be there
            assert len(forms) == 1, msgid
    assert not bad, bad


def test_every_chinese_entry_is_translated_and_none_fuzzy():
    zh = entries("zh_CN")
    empty = [k for k, m in zh.items() if not (m.string if isinstance(m.string, str) else all(m.string))]
    assert not empty, f"translate these in {po_path('zh_CN')}: {empty}"
    assert not [k for k, m in zh.items() if m.fuzzy]


def test_the_catalogs_hold_every_text_the_code_marks():
    """`python -m visualizers.i18n.extract` has been run: a text added to the code is in the
    template and in both catalogs (and the template is the one committed)."""
    found = {m.id for m in template() if m.id}
    with (LOCALES / "messages.pot").open("rb") as f:
        pot = {m.id for m in read_po(f) if m.id}
    assert found == pot, f"run python -m visualizers.i18n.extract: {found ^ pot}"
    for lang in LANGS:
        assert found <= set(entries(lang)), (lang, found - set(entries(lang)))


def test_the_glossary_terms_are_used():
    zh, bad = entries("zh_CN"), []
    for term in (t for t in glossary.terms() if t["check"]):
        for msgid, m in zh.items():
            english = " ".join(msgid) if isinstance(msgid, tuple) else msgid
            text = " ".join(m.string) if isinstance(m.string, tuple) else m.string
            if re.search(rf"(?<![\w/]){re.escape(term['en'])}(?![\w/])", english, re.I) and term["zh"] not in text:
                bad.append((term["en"], term["zh"], msgid, text))
    assert not bad, bad
    assert "| KV cache | KV 缓存 |" in glossary.markdown_table()


def test_gettext_and_plurals():
    assert i18n.gettext("zh_CN", "Send") == "发送" and i18n.gettext("en", "Send") == "Send"
    assert i18n.gettext("fr", "Send") == "Send"  # a language with no catalog: English
    one = ("{request}: streaming, {n} token", "{request}: streaming, {n} tokens")
    assert i18n.ngettext("en", *one, 1, request="r") == "r: streaming, 1 token"
    assert i18n.ngettext("en", *one, 1234, request="r") == "r: streaming, 1,234 tokens"
    assert i18n.ngettext("zh_CN", *one, 5, request="r") == "r：流式输出中，已生成 5 个词元"
    assert i18n.gettext("zh_CN", "no such text") == "no such text"


@pytest.mark.parametrize("query, cookie, accept, want", [
    (None, None, "zh-CN,zh;q=0.9,en;q=0.8", "zh_CN"),
    (None, None, "en-US,en;q=0.9,zh;q=0.8", "en"),
    (None, None, "fr-FR, zh-Hans;q=0.5, en;q=0.4", "zh_CN"),
    (None, None, "de, fr", "en"),
    (None, None, None, "en"),
    (None, "zh-CN", "en-US", "zh_CN"),  # the switch, remembered, over the browser's language
    (None, "en", "zh-CN", "en"),
    ("en", "zh-CN", "zh-CN", "en"),  # ?lang= forces one
    ("zh-CN", "en", "en", "zh_CN"),
    ("xx", None, "zh", "zh_CN"),  # an unknown ?lang= forces nothing
])
def test_which_language(query, cookie, accept, want):
    assert i18n.choose(query, cookie, accept) == want


def test_numbers_for_the_language():
    assert i18n.number("zh_CN", 1234567) == "1,234,567" and i18n.number("en", 0.5, 2) == "0.50"
    assert i18n.percent("zh_CN", 0.125) == "12%" and i18n.percent("en", 0.125, 1) == "12.5%"
    assert i18n.size("zh_CN", 262 * 2 ** 20) == "262.0 MiB" and i18n.size("en", 512) == "512 B"
    assert i18n.seconds("en", 0.0125) == "12.5 ms" and i18n.seconds("zh_CN", 1.25) == "1.25 s"


def test_the_docs_show_the_glossary():
    assert glossary.markdown_table() in (ROOT / "docs" / "languages.md").read_text(encoding="utf-8")
