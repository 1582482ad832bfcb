"""One language's version of a classroom's stages. A room builds it once per trace version for
each language its screens asked for (their browser's Accept-Language, cookie, ?lang or switch),
never per follower: a hall of 300 in two languages costs two renders of each stage. The
presenter's moves carry no words, so every screen follows them whatever its language."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import cache

from visualizers import i18n
from visualizers.journey import Stage


@dataclass
class Tongue:
    stages: list[Stage] = field(default_factory=list)  # numbered, the skipped ones left out, the extra after
    skipped: list[str] = field(default_factory=list)  # the titles of the stages this request skips


@cache
def _speaks(render) -> bool:
    return "lang" in inspect.signature(render).parameters


def panel_html(view, name: str, lang: str) -> str:
    """The page's panel `name` of `view` in `lang`, where the panels take a language (the page's
    panels come to the catalogs one by one: until then a panel draws its English)."""
    render = type(view).render
    if lang != i18n.DEFAULT and _speaks(render):
        return view.render(name, lang=lang)
    return view.render(name)
