"""Issue 42 item 4: tokens grouped into the characters they decode to. A character split into
byte pieces is one box spanning its pieces (each piece as wide as its bytes, its id and bytes on
hover); a piece that ends one character and starts the next sits under both boxes; bytes that
make no character are named; whole-word tokens stay one chip; text is escaped."""
from __future__ import annotations

import re

from visualizers.answer import answer_html
from visualizers.attention import _axis
from visualizers.char_runs import cjk_note, label_html, label_title, lone_html, lone_title
from visualizers.logit_lens import _bytes_note, _visible
from visualizers.selection import Selection
from visualizers.token_chars import group, label_bytes
from visualizers.tokens import tokens_html

SHI = ["<0xE4><0xBB>", "<0x80>"]  # 什 = E4 BB 80, as SmolLM2 cuts it
JOINED = ["<0xE4><0xBB>", "<0x80><0xE4>", "<0xB9><0x88>"]  # 什么 with a piece that ends 什 and starts 么


def panel(labels, special=(), generated=()):
    toks = [{"id": 100 + i, "piece": f"p{i}", "text": t, "special": i < len(special) and special[i]}
            for i, t in enumerate(labels)]
    return tokens_html({"tokens": toks, "count": len(toks), "vocab_size": 1000}, generated)


def boxes(html: str) -> list[tuple[str, str]]:
    """(grid-column, text) of each character box."""
    return re.findall(r'class="tt-char[^"]*" style="grid-column:([0-9/]+)"[^>]*>([^<]*)</span>', html)


def chip_columns(html: str) -> list[str]:
    return re.findall(r'<span style="grid-column:([0-9/]+)" class="tt-chip', html)


def test_a_label_s_bytes_mix_text_and_named_bytes():
    assert label_bytes(" <0xE7>") == b" \xe7" and label_bytes("是") == "是".encode() and label_bytes("KV") == b"KV"


def test_a_character_split_over_two_pieces_is_one_box_over_both():
    runs, run_of = group(SHI + ["是"])
    assert run_of == (0, 0, 1) and [(c.text, c.first, c.last) for c in runs[0].chars] == [("什", 0, 1)]
    html = panel(SHI + ["是"])
    assert boxes(html) == [("1/4", "什")]  # three byte columns
    assert chip_columns(html) == ["1/3", "3/4"]  # E4 BB under the first two, 80 under the third
    assert '<span class="tt-hex">E4 BB</span><sub>100</sub>' in html and '<span class="tt-hex">80</span><sub>101</sub>' in html
    assert "bytes E4 BB: 2 of the 3 bytes of 什 (U+4EC0)" in html  # the piece's hover
    assert ">是<sub>102</sub>" in html and html.count("tt-run") == 1  # a whole character: a chip as before


def test_a_piece_that_ends_one_character_and_starts_the_next_sits_under_both():
    runs, _ = group(JOINED)
    assert len(runs) == 1 and [(c.text, c.first, c.last) for c in runs[0].chars] == [("什", 0, 1), ("么", 1, 2)]
    html = panel(JOINED)
    assert boxes(html) == [("1/4", "什"), ("4/7", "么")]
    assert chip_columns(html) == ["1/3", "3/5", "5/7"]  # the middle piece: the end of 什 and the start of 么
    assert "bytes 80 E4: 1 of the 3 bytes of 什 (U+4EC0); 1 of the 3 bytes of 么 (U+4E48)" in html


def test_bytes_that_make_no_character_are_named_never_joined_across_a_special_token():
    runs, _ = group(["<0xE4>", "<|im_end|>", "<0xBB><0x80>"], [False, True, False])
    assert [[c.valid for c in r.chars] for r in runs] == [[False], [True] * 10, [False, False]]
    html = panel(["<0xE4>", "<|im_end|>", "<0xBB><0x80>", "<0xFF>"], special=[False, True])
    assert html.count("tt-char-bad") == 4 and "byte E4: no character starts or ends here" in html
    assert "&lt;|im_end|&gt;<sub>101</sub>" in html
    assert label_html(["a", "<0xFF>"], 1) == '<span class="tt-part tt-part-bad">FF</span>'


def test_whole_word_tokens_stay_one_chip_and_the_note_counts_characters_a_token():
    labels = ["什么是", "KV", "缓存", "？"]  # Gemma 3's cut of 什么是KV缓存？
    html = panel(labels)
    assert "tt-run" not in html and ">什么是<sub>100</sub>" in html and ">缓存<sub>102</sub>" in html
    note = cjk_note(labels, [False] * 4)
    assert "<b>6</b> characters in <b>3</b> tokens (<b>2.0</b> characters a token" in note
    assert '2 tokens of several whole characters: <span class="tt-chip tt-word">什么是</span>' in note
    assert 'class="tt-chip tt-word" data-pos="0"' in html and 'class="tt-chip" data-pos="1"' in html
    assert "0.3</b> characters a token" in cjk_note(["<0xE4>", "<0xBB>", "<0x80>"], [False] * 3)
    assert cjk_note(["Hello", " world"], [False, False]) == ""


def test_english_is_drawn_as_before():
    html = panel(["Hello", " world", "!"])
    assert "tt-run" not in html and "tt-cjk-note" not in html and "tt-hex" not in html
    assert label_html(["Hello", " world"], 1, 6) == "␣world" and label_title(["Hello"], 0) == ""


def test_text_beside_the_bytes_is_escaped():
    html = panel(['<b x="1">&<0xE4><0xBB>', "<0x80>"])
    assert "<b x" not in html and "&lt;" in html and "&amp;" in html and "&quot;" in html
    assert ("&lt;", "什") == (boxes(html)[0][1], boxes(html)[-1][1])
    assert "<b" not in label_html(['<b><0xE4>', "<0xBB><0x80>"], 0).replace("<span", "")


def test_the_attention_labels_draw_a_piece_as_its_character_dashed():
    labels = ["用", *SHI]
    rows, cols = _axis(labels, 0, 3, ["prefill"] * 3, None, [0, 1, 2], (0, 0))
    assert rows.count('<span class="tt-part">什</span>') == 2 and cols.count('<span class="tt-part">什</span>') == 2
    assert "bytes 80: 1 of the 3 bytes of 什" in rows and ">用<i>0</i>" in rows


def test_the_selection_line_names_a_piece_by_its_character():
    sel = Selection(1, ("用", *SHI))
    assert sel.token(1) == sel.token(2) == '<code><span class="tt-part">什</span></code>' and sel.token(0) == "<code>用</code>"


def test_the_logit_lens_names_a_lone_piece_by_its_bytes():
    assert lone_html("<0xE4><0xBB>") == '<span class="tt-part tt-part-bad">E4</span><span class="tt-part tt-part-bad">BB</span>'
    assert lone_title("<0xE4><0xBB>") == "bytes E4 BB: the start of a 3-byte character, finished by the next token"
    assert lone_title("<0x80>") == "bytes 80: the end of a character begun by the token before"
    assert _visible("Paris", 1) == "Paris"
    # a candidate that would finish the character the tokens before it began: that character, dashed
    assert _visible("<0x80>", 5, ["用", "<0xE4><0xBB>"]) == '<span class="tt-part">什</span>'
    assert _bytes_note("<0x80>", ["<0xE4><0xBB>"]) == " · bytes 80: 1 of the 3 bytes of 什 (U+4EC0)"


def test_the_answer_draws_its_pieces_under_their_character():
    toks = [{"index": i, "token_id": 7 + i, "text": text, "t": 0.1 * i, "latency": 0.1}
            for i, text in enumerate(("", "什", "是"))]
    labels = {7: SHI[0], 8: SHI[1], 9: "是"}
    html = answer_html(toks, piece=labels.__getitem__)
    assert boxes(html) == [("1/4", "什")] and '<span class="tt-hex">E4 BB</span></span>' in html
    assert html.count("tt-timed") == 3 and "bytes E4 BB: 2 of the 3 bytes of 什" in html
