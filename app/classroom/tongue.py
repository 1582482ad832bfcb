"""One language's version of a classroom's stages. A room builds it once per trace version for
each language its screens asked for (their browser's Accept-Language, cookie, ?lang or switch),
never per follower: a hall of 300 in two languages costs two renders of each stage. The
presenter's moves carry no words, so every screen follows them whatever its language."""
from __future__ import annotations

from dataclasses import dataclass, field

from visualizers.journey import Stage


@dataclass
class Tongue:
    stages: list[Stage] = field(default_factory=list)  # numbered, the skipped ones left out, the extra after
    skipped: list[str] = field(default_factory=list)  # the titles of the stages this request skips


def panel_html(view, name: str, lang: str) -> str:
    """The page's panel `name` of `view` in `lang`: a view that keeps a language (LiveView.lang,
    as the page's tabs set it) draws its panel's words in it; one that keeps none draws English."""
    if hasattr(view, "lang"):
        view.lang = lang
    return view.render(name)
