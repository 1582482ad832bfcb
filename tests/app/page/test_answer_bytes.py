"""Issue 38 item 9: byte-fallback tokens shown as their bytes. An emoji the model writes in two
byte-level pieces streams no text with its first piece (its character is not complete yet): the
answer's timed chips drew that piece as "(no text, id N)"; they now show its bytes, as the
tokens panel labels it, and since issue 42 both pieces sit under the character's box."""
from __future__ import annotations

from app.page.live_view import LiveView
from tests.trace_views import MODEL
from visualizers.kv_cache import empty_pool

LABELS = {5: "Hi", 7: "<0xF0><0x9F>", 8: "<0x99><0x82>", 9: "<end>"}


def test_a_piece_of_a_character_in_the_answer_shows_its_bytes():
    v = LiveView(model=MODEL, piece=LABELS.__getitem__, is_special=lambda i: i == 9)
    v.request_id = "r1"
    v.set_pool(empty_pool(8, 2))
    v.add([{"type": "output", "token_id": t, "text": text, "finished": False, "index": i, "t": 0.01 * (i + 1),
            "step": i + 1} for i, (t, text) in enumerate(((5, "Hi"), (7, ""), (8, "🙂"), (9, "")))])
    html = v.render("answer")
    assert '<span class="tt-hex">F0 9F</span>' in html and "(no text, id 7)" not in html
    assert '<span class="tt-hex">99 82</span>' in html  # the piece that completes it: its bytes
    assert 'class="tt-char" style="grid-column:1/5"' in html and "🙂</span>" in html  # under the character
    assert "(no text, id 9)" in html  # not a byte: named as before
