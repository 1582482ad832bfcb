"""The page's language, per browser tab: chosen at load (`?lang=`, else the switch's cookie,
else Accept-Language), changed at once by the switch (English / 中文), which the browser
remembers (a cookie, read at the next load). The page is built once, in English; each tab's
chrome (tab names, buttons, labels, info lines, placeholders, the header) is then set to its
language with gr.update from the load and switch handlers. Which texts: every component
whose English text has a catalog entry (found by walking the built page), so a new label is
translated by adding its entry, with no code. Handlers that write text (Status) ask
`lang_of(key)`."""
from __future__ import annotations

import re
from functools import cache
from typing import Callable, Sequence
from http.cookies import CookieError, SimpleCookie

import gradio as gr

from app.page.tabs import key_of, lang_of, set_lang
from visualizers import i18n
from visualizers.i18n.catalog import read

CHOICES = {"English": "en", "中文": "zh_CN"}  # the switch's words -> a language
WORD = {lang: word for word, lang in CHOICES.items()}
TRANSLATED = "tt-i18n"  # an HTML block with this class has its text nodes translated
TEXT_ATTRS = ("label", "info", "placeholder")
CSS = """#tt-lang {max-width: 200px; margin: -8px 0 -4px auto; padding: 0; background: none; border: none !important;
  box-shadow: none}
#tt-lang .wrap {gap: 4px}
#tt-lang label {padding: 2px 8px; font-size: 0.9em}"""
# the switch writes the cookie the next load reads (and <html lang>), then the handler translates
REMEMBER = ("(v) => { const t = v === '中文' ? 'zh-CN' : 'en'; "
            "document.cookie = '%s=' + t + '; path=/; max-age=31536000; SameSite=Lax'; "
            "document.documentElement.lang = t; return v; }" % i18n.COOKIE)


def tx(key: str, msgid: str, **values) -> str:
    """msgid in the language of the tab `key`."""
    return i18n.gettext(lang_of(key), msgid, **values)


def ntx(key: str, singular: str, plural: str, n: int, **values) -> str:
    return i18n.ngettext(lang_of(key), singular, plural, n, **values)


def of_request(request: gr.Request | None) -> str:
    """The language a page load asks for: ?lang=, the cookie, Accept-Language."""
    if request is None:
        return i18n.DEFAULT
    headers = getattr(request, "headers", None) or {}
    cookie = None
    try:
        jar = SimpleCookie(headers.get("cookie", ""))
        cookie = jar[i18n.COOKIE].value if i18n.COOKIE in jar else None
    except CookieError:
        pass
    query = getattr(request, "query_params", None) or {}
    return i18n.choose(query.get("lang"), cookie, headers.get("accept-language"))


def switch() -> gr.Radio:
    return gr.Radio(list(CHOICES), value="English", show_label=False, container=False, elem_id="tt-lang",
                    label="Language")


@cache
def _known() -> frozenset[str]:
    return frozenset(m.id for m in read("en") if m.id and isinstance(m.id, str))


def localized(lang: str, named: dict) -> dict:
    """A handler's {name: value} with the labels, info lines and placeholders its updates set
    (a model picked: the prompt boxes' labels) in `lang`, where the catalogs have them."""
    if lang == i18n.DEFAULT:
        return named
    known, out = _known(), dict(named)
    for name, v in named.items():
        if isinstance(v, dict) and any(isinstance(v.get(a), str) and v[a] in known for a in TEXT_ATTRS):
            out[name] = {**v, **{a: i18n.gettext(lang, v[a]) for a in TEXT_ATTRS if isinstance(v.get(a), str)}}
    return out


def _html_texts(html: str) -> list[str]:
    return [s.strip() for s in re.findall(r">([^<>]+)<", html) if s.strip()]


def chrome_of(page: gr.Blocks) -> list[tuple[gr.blocks.Block, dict[str, str]]]:
    """Each block of the built page with its English texts that have a catalog entry:
    [(block, {attribute: English})] (label, info, placeholder; a button's text; a marked
    HTML block's whole value; a marked picker's shown choices, its values kept)."""
    known, out = _known(), []
    for block in page.blocks.values():
        texts = {a: getattr(block, a) for a in TEXT_ATTRS
                 if isinstance(getattr(block, a, None), str) and getattr(block, a) in known}
        if type(block) is gr.Button and isinstance(block.value, str) and block.value in known:
            texts["value"] = block.value
        if isinstance(block, gr.HTML) and TRANSLATED in (block.elem_classes or []) and isinstance(block.value, str):
            texts["value"] = block.value
        if isinstance(block, (gr.Dropdown, gr.Radio)) and TRANSLATED in (block.elem_classes or []):
            texts["choices"] = block.choices  # a marked picker: [(shown, value)], the shown words translated
        if texts and block is not None:
            out.append((block, texts))
    return out


def translate_html(lang: str, html: str) -> str:
    """A marked HTML block in `lang`: each text node that is a catalog entry translated
    (the text is the catalog's, escaped there as it was in the English)."""
    known = _known()

    def one(m: re.Match) -> str:
        text = m.group(1)
        core = text.strip()
        return ">" + text.replace(core, i18n.gettext(lang, core)) + "<" if core in known else m.group(0)
    return re.sub(r">([^<>]+)<", one, html)


def chrome_updates(lang: str, chrome: list) -> dict:
    out = {}
    for block, texts in chrome:
        if isinstance(block, gr.HTML):
            out[block] = gr.update(value=translate_html(lang, texts["value"]))
        elif "choices" in texts:
            out[block] = gr.update(choices=[(i18n.gettext(lang, shown), v) for shown, v in texts["choices"]],
                                   **{a: i18n.gettext(lang, t) for a, t in texts.items() if a != "choices"})
        else:
            out[block] = gr.update(**{a: i18n.gettext(lang, msgid) for a, msgid in texts.items()})
    return out


def wire(page: gr.Blocks, radio: gr.Radio, journey: Callable[[str, bool], dict] | None = None,
         journey_out: Sequence = ()) -> None:
    """The load and the switch set the tab's language and its chrome, then (journey(key, redraw)
    -> {component: value}) the words drawn in that language; redraw: the panels too (the switch,
    a load in another language than the English the page is built in). Call once every tab's
    blocks exist."""
    chrome = chrome_of(page)
    outputs = [radio] + [b for b, _ in chrome] + [c for c in journey_out if c not in {b for b, _ in chrome}]
    quiet = {"api_visibility": "private", "show_progress": "hidden", "concurrency_limit": None}

    def apply(request: gr.Request, lang: str, chrome_too: bool = True) -> dict:
        set_lang(key_of(request), lang)
        out = chrome_updates(lang, chrome) if chrome_too else {}
        out[radio] = gr.update(**{**out.get(radio, {}), "value": WORD[lang]})  # (its label is chrome too)
        return {**out, **(journey(key_of(request), chrome_too) if journey else {})}

    def on_load(request: gr.Request) -> dict:
        # the page is built in English: an English tab's load touches none of its ~100 blocks
        # (their updates, late on a busy machine, landed while a reader already typed)
        lang = of_request(request)
        return apply(request, lang, chrome_too=lang != i18n.DEFAULT)

    def on_switch(word: str, request: gr.Request) -> dict:
        return apply(request, CHOICES.get(word, i18n.DEFAULT))

    page.load(on_load, None, outputs, **quiet)
    radio.input(on_switch, radio, outputs, js=REMEMBER, **quiet)
