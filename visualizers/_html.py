"""Shared helpers: escaping, colour scales and a tiny PNG encoder.

Every string that came from a prompt, a token or an id goes through `esc` before it
enters markup: token text is untrusted. Dense matrices (attention, embeddings) are
drawn as small PNG images scaled up with CSS: a 64x64 heatmap is a few KB, where the
same grid of <div>s would be hundreds of KB per update.
"""
from __future__ import annotations

import base64
import html
import json
import struct
import zlib
from typing import Mapping, Sequence

import numpy as np

from visualizers import i18n
from visualizers.i18n.catalog import translations

# Perceptually ordered anchors (viridis-like) for values in [0, 1].
_SEQ = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], dtype=float)
# Diverging anchors (blue - white - red) for signed values.
_DIV = np.array([[33, 102, 172], [146, 197, 222], [247, 247, 247], [244, 165, 130], [178, 24, 43]], dtype=float)


def esc(value: object) -> str:
    """Text for HTML content and attribute values (quotes escaped too)."""
    return html.escape(str(value), quote=True)


def prob(x: float) -> str:
    """A probability as the whole page prints it (stage sentence, chip, panel, hover): two decimals, or two
    significant digits for an unlikely one (a draw at temperature 1 may take a token of
    p 0.00039: never "0.00")."""
    if x >= 0.095 or x <= 0:
        return f"{max(0.0, x):.2f}"  # max(0.0, -0.0): no minus sign
    return f"{x:.2g}".replace("e-0", "e-")


def show_piece(text: str) -> str:
    """Make whitespace and control characters visible in a token chip (then escape): ␣ a
    space, ↵ a newline, ⇥ a tab, ⍽ a no-break space, \\xNN or \\uNNNN any other invisible one."""
    out = []
    for ch in text:
        if ch == " ":
            out.append("\u2423")
        elif ch == "\n":
            out.append("\u21b5")
        elif ch == "\t":
            out.append("\u21e5")
        elif ch == "\xa0":
            out.append("\u237d")  # ⍽, the usual mark of a no-break space
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        elif ch.isspace() or not ch.isprintable():  # other spaces, zero-width and format characters
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return esc("".join(out))


def piece_text(token_id: int, pieces: Mapping[int, str] | None) -> str:
    if pieces is not None and token_id in pieces:
        return pieces[token_id]
    return f"#{token_id}"


def colormap(values: np.ndarray, diverging: bool = False) -> np.ndarray:
    """values in [0, 1] (or [-1, 1] when diverging) -> uint8 RGB of shape values.shape + (3,)."""
    anchors = _DIV if diverging else _SEQ
    v = np.asarray(values, dtype=float)
    v = (np.clip(v, -1, 1) + 1) / 2 if diverging else np.clip(v, 0, 1)
    pos = v * (len(anchors) - 1)
    lo = np.floor(pos).astype(int).clip(0, len(anchors) - 2)
    frac = (pos - lo)[..., None]
    rgb = anchors[lo] * (1 - frac) + anchors[lo + 1] * frac
    return rgb.round().astype(np.uint8)


def rgb_css(value: float, diverging: bool = False) -> str:
    r, g, b = colormap(np.array([value]), diverging)[0]
    return f"rgb({r},{g},{b})"


def png_data_uri(rgb: np.ndarray) -> str:
    """uint8 [H, W, 3] -> data: URI of a PNG (no imaging library needed)."""
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
    return "data:image/png;base64," + base64.b64encode(png).decode()


def heat_img(rgb: np.ndarray, css_class: str, title: str, height_px: int | None = None) -> str:
    style = f' style="height:{height_px}px"' if height_px else ""
    return f'<img class="{css_class}" alt="{esc(title)}" title="{esc(title)}" src="{png_data_uri(rgb)}"{style}>'


def bold(text: object) -> str:
    """Safe HTML (a number, a formatted value) in bold: a value filled into a catalog's text."""
    return f"<b>{text}</b>"


def said_html(lang: str, msgid: str, **values: str) -> str:
    """A panel's text from the catalogs in `lang` as HTML: the text escaped, its {names} filled
    with the given HTML (escape what came from a token or a request before passing it)."""
    text = html.escape(i18n.gettext(lang, msgid), quote=False)
    return text.format(**values) if values else text


def said_html_n(lang: str, singular: str, plural: str, k: int, bold: bool = False, **values: str) -> str:
    """said_html() in the form the count k takes in `lang` ({n}: k, grouped for the language; bold:
    in <b>)."""
    text = html.escape(translations(lang).ngettext(singular, plural, k), quote=False)
    num = i18n.number(lang, k)
    return text.format(n=f"<b>{num}</b>" if bold else num, **values)


def empty(message: str) -> str:
    return f'<div class="tt-empty">{esc(message)}</div>'


def panel(title: str, body: str, note: str = "") -> str:
    note_html = f'<span class="tt-note">{esc(note)}</span>' if note else ""
    return f'<div class="tt-panel"><div class="tt-title">{esc(title)}{note_html}</div>{body}</div>'


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{int(n):,} B"


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{0.0 if round(ms, 1) == 0 else ms:,.1f} ms"  # never "-0.0 ms"


def fixed(x: float, digits: int) -> str:
    """x with `digits` decimals, never "-0.00" (a tiny negative rounds to a plain zero)."""
    text = f"{x:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def not_recorded(title: str, message: str) -> str:
    """A panel whose stage this request does not record (its capture level), or has not reached."""
    # marked, so the page can hide the controls that would pick in it (the attention's layer / head)
    return panel(title, empty(message)).replace('<div class="tt-panel">', '<div class="tt-panel tt-not-recorded">', 1)


def bar(fraction: float, css_class: str = "tt-bar") -> str:
    pct = max(0.0, min(1.0, fraction)) * 100
    return f'<span class="{css_class}"><span style="width:{pct:.1f}%"></span></span>'


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], css_class: str = "tt-table") -> str:
    """headers are escaped here; row cells must already be safe HTML."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{css_class}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


# --- hover: a matrix drawn as one PNG answers the pointer with its exact cell (app/page/hover.js) ---
NOT_CAPTURED, MASKED, OUTSIDE_WINDOW = 65535, 65534, 65533  # codes in a "u16" grid


def hover_attr(spec: dict, values: np.ndarray | None = None, scale: float = 1e4, signed: bool = False) -> str:
    """data-tt-hover="…": what app/page/hover.js needs to name the cell under the pointer. spec: "w",
    "h" (cells across and down the image), "x0" (leading gutter columns), "rows"/"cols" (labels;
    "same": the columns are the rows' positions),
    "fmt" (e.g. "query {r} → key {c} · weight {v}"), "ctx". values [h, w - x0]: the trace's
    numbers (4 decimals) packed as integers x scale, base64 (a 96 x 96 map is ~25 KB, not ~60 KB
    of JSON); NaN: not captured, or a code already in a u16 grid."""
    spec = dict(spec)
    if values is not None:
        if signed:
            packed = np.round(np.nan_to_num(values) * scale).astype("<i4")
        else:
            v = np.asarray(values, dtype=float)
            packed = np.where(np.isnan(v), NOT_CAPTURED, np.clip(np.round(v * scale), 0, MASKED - 2)).astype("<u2")
            if "codes" in spec:  # masks drawn over the values: their own words
                for code, mask in spec.pop("codes"):
                    packed[mask] = code
        spec.update(v=base64.b64encode(packed.tobytes()).decode(), enc="i32" if signed else "u16", scale=scale)
    return f'data-tt-hover="{esc(json.dumps(spec, separators=(",", ":")))}"'


def hover_img(rgb: np.ndarray, css_class: str, alt: str, hover: str, width: int, height: int) -> str:
    """A heatmap whose cells answer the pointer (hover: hover_attr's); no title, whose native
    tooltip would cover the cell's own."""
    return (f'<img class="{css_class}" alt="{esc(alt)}" width="{width}" height="{height}" {hover} '
            f'src="{png_data_uri(rgb)}">')
