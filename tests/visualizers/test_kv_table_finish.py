"""Issue 38 item 7: after the finish the KV table says what this request held. A verify step
writes the K/V of every draft it checks; the rejected ones' slots are never part of the answer.
The table drew them as written ("positions 32–42 · 11/16") beside "it held 40 tokens"."""
from __future__ import annotations

import re

import visualizers as viz

MODEL = {"num_layers": 2, "num_kv_heads": 1, "head_dim": 4, "dtype": "float32", "dtype_bytes": 4,
         "num_blocks": 8, "block_size": 16, "kv_cache_bytes": 8 * 16 * 64}


def test_the_finished_table_ends_at_the_tokens_the_request_held():
    events = [{"type": "kv.alloc", "step": 1, "blocks": [0, 1, 2], "table": [0, 1, 2]},
              {"type": "kv.fill", "step": 1, "fills": [{"block": 0, "offset": 0, "count": 16},
                                                       {"block": 1, "offset": 0, "count": 11}], "tokens": 27},
              {"type": "kv.fill", "step": 2, "fills": [{"block": 1, "offset": 11, "count": 5},
                                                       {"block": 2, "offset": 0, "count": 11}], "tokens": 43},
              {"type": "kv.free", "step": 3, "blocks": [0, 1, 2], "cached": [0, 1]}]
    gone = {"step": 3, "num_blocks": 8, "block_size": 16, "ref": [0] * 8, "cached": [True, True] + [False] * 6,
            "owners": {}, "fill": {}}
    html = viz.kv_grid_html(gone, "me", events, MODEL, final_tokens=40)  # 3 of step 2's drafts were rejected
    assert "finished: it held 40 tokens in 3 blocks" in html
    feet = re.findall(r"class=\"tt-kvt-foot\">([^<]*)<", html)
    assert feet == ["positions 0–15 · 16/16", "positions 16–31 · 16/16", "positions 32–39 · 8/16"], feet
