"""Finds every text the catalogs must hold and brings the catalogs up to date:

    python -m visualizers.i18n.extract          # writes messages.pot, updates en and zh_CN

What it reads (as text: nothing is imported):
- Python under app/ and visualizers/: gettext(lang, "…"), ngettext(lang, "…", "…", n),
  tx(key, "…"), ntx(key, "…", "…", n), the stages' said(f, "…") and said_n(f, "…", "…", n), and
  N_("…") (Babel's Python extractor);
- the page's chrome in app/page/: a component's label=, info=, placeholder= and a button's,
  tab's or accordion's first argument when they are plain strings, and the text of an HTML
  block marked with language.TRANSLATED;
- the classroom: tr('…') and trn('…', '…', n) in classroom.js, {{…}} in its .html templates.

A new text lands in every .po with an empty translation (English is shown until it is
written; the catalog tests list it); a text no longer used is kept as obsolete (#~)."""
from __future__ import annotations

import ast
import re
from datetime import datetime, timezone
from pathlib import Path

from babel.messages.catalog import Catalog
from babel.messages.extract import extract_python
from babel.messages.pofile import read_po, write_po

from visualizers.i18n.catalog import LANGS, LOCALES, po_path

ROOT = Path(__file__).resolve().parents[2]
KEYWORDS = {"gettext": (2,), "ngettext": (2, 3), "tx": (2,), "ntx": (2, 3), "said": (2,), "said_in": (2,),
            "said_n": (2, 3), "said_html": (2,), "said_html_n": (2, 3),
            "N_": None}
TEXT_ATTRS = ("label", "info", "placeholder")
FIRST_ARG = {"Button", "UploadButton", "DownloadButton", "Tab", "Accordion"}
JS_CALL = re.compile(r"\btr\((['\"])(.+?)\1|\btrn\((['\"])(.+?)\3,\s*(['\"])(.+?)\5")
HTML_TEXT = re.compile(r"\{\{(.+?)\}\}")
CREATED = datetime(2026, 12, 6, tzinfo=timezone.utc)


def _python(path: Path) -> list[tuple[str | tuple, int]]:
    with path.open("rb") as f:
        found = list(extract_python(f, KEYWORDS.keys(), [], {}))
    out = []
    for line, func, msg, _ in found:
        spec = KEYWORDS[func]
        args = msg if isinstance(msg, tuple) else (msg,)
        if spec is None:
            picked = args[:1]
        else:
            picked = tuple(args[i - 1] if i - 1 < len(args) else None for i in spec)
        if all(isinstance(a, str) and a for a in picked):
            out.append((picked[0] if len(picked) == 1 else picked, line))
    return out


def _const(node) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):  # an f-string: its fixed parts (a marked HTML block's text)
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant))
    return None


def _chrome(path: Path) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "gr"):
            continue
        kinds = {k.arg: k.value for k in node.keywords}
        for attr in TEXT_ATTRS:
            if attr in kinds and isinstance(kinds[attr], ast.Constant) and isinstance(kinds[attr].value, str):
                out.append((kinds[attr].value, node.lineno))
        if node.func.attr in FIRST_ARG and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            out.append((node.args[0].value, node.lineno))
        marked = "elem_classes" in kinds and "TRANSLATED" in ast.dump(kinds["elem_classes"])
        if node.func.attr == "HTML" and marked and node.args and (html := _const(node.args[0])):
            out += [(s.strip(), node.lineno) for s in re.findall(r">([^<>{}]+)<", html) if s.strip()]
    return [(s, line) for s, line in out if s.strip()]


def _classroom(path: Path) -> list[tuple[str | tuple, int]]:
    text, out = path.read_text(encoding="utf-8"), []
    pattern = JS_CALL if path.suffix == ".js" else HTML_TEXT
    for m in pattern.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        if path.suffix != ".js":
            out.append((m.group(1), line))
        else:
            out.append((m.group(2), line) if m.group(2) else ((m.group(4), m.group(6)), line))
    return out


def _engine_words(path: Path) -> list[tuple[str, int]]:
    """The values of a module-level `PATHS = {...}` (the engine's code map names its code paths
    in words; the engine imports nothing of visualizers/, so it cannot mark them), and each
    `Code(name, why, ...)`'s why (the line an open code view gives each function)."""
    out = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "PATHS" for t in node.targets) \
                and isinstance(node.value, ast.Dict):
            out += [(v.value, v.lineno) for v in node.value.values if isinstance(v, ast.Constant)
                    and isinstance(v.value, str)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Code" and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            out.append((node.args[1].value, node.args[1].lineno))
    return out


def template() -> Catalog:
    """Every text found, in the order of the files that write them (messages.pot)."""
    # a fixed date: a run that finds the same texts writes the same files (no diff, no conflict)
    cat = Catalog(project="TokenTrace", msgid_bugs_address="", fuzzy=False, creation_date=CREATED)
    found = []
    for path in sorted((ROOT / "app").rglob("*.py")) + sorted((ROOT / "visualizers").rglob("*.py")):
        found += [(m, path, line) for m, line in _python(path)]
    for path in sorted((ROOT / "app" / "page").glob("*.py")):
        found += [(m, path, line) for m, line in _chrome(path)]
    for path in (ROOT / "engine" / "code_map.py", ROOT / "app" / "page" / "intake_code.py"):
        found += [(m, path, line) for m, line in _engine_words(path)]
    for path in sorted((ROOT / "app" / "classroom").glob("*.js")) + sorted((ROOT / "app" / "classroom").glob("*.html")):
        found += [(m, path, line) for m, line in _classroom(path)]
    for msg, path, line in found:
        where = (str(path.relative_to(ROOT)), line)
        if msg in cat:
            cat[msg].locations.append(where)
        else:
            cat.add(msg, locations=[where], flags=("python-brace-format",) if "{" in str(msg) else ())
    return cat


def update() -> Catalog:
    pot = template()
    with (LOCALES / "messages.pot").open("wb") as f:
        write_po(f, pot, width=100, omit_header=False)
    for lang in LANGS:
        path = po_path(lang)
        if path.exists():
            with path.open("rb") as f:
                cat = read_po(f, locale=lang)
        else:
            cat = Catalog(locale=lang, project="TokenTrace", fuzzy=False)
        cat.update(pot, no_fuzzy_matching=True)
        with path.open("wb") as f:
            write_po(f, cat, width=100, include_previous=False)
    return pot


if __name__ == "__main__":
    print(f"{len(update())} messages")
