"""The seed box says what a seed does: at temperature 0 the draw is greedy (the argmax) and a
seed changes nothing, so "empty = a random draw" alone was untrue there (issue 38 item 9)."""
from __future__ import annotations

from app.page.layout import build_page
from app.serving.recording import Recording


def test_the_seed_box_says_it_matters_only_above_temperature_0(recording: Recording):
    page = build_page(None, recording)  # a replay: the same controls (tests/app/conftest.py's real run)
    seed = next(b for b in page.blocks.values() if getattr(b, "elem_id", None) == "tt-seed")
    assert "temperature > 0" in seed.label and "greedy" in seed.label
