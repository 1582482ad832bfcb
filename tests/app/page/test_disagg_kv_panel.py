"""The KV panel with more than one decode engine (--disaggregate --decode-ranks 2): each decode
engine has its own pool (kv.pool: decode 0's; kv.decode_pool: the others', with engine_index),
and a request's panel draws the pool of the engine it decoded on, with its own blocks there."""
from __future__ import annotations

import re

import pytest

from app.page.live_view import LiveView
from engine import LLM, EventList, SamplingParams
from tests.paths import ROOT

pytestmark = pytest.mark.slow
EMBEDDED = ROOT / "assets" / "models" / "target"
MODEL = {"name": "embedded", "num_layers": 4, "num_kv_heads": 2, "head_dim": 32, "dtype": "float32",
         "dtype_bytes": 4, "block_size": 4, "kv_cache_bytes": 1}


def test_each_request_is_drawn_on_the_pool_of_its_decode_engine():
    with LLM(EMBEDDED, device="cpu", dtype="float32", block_size=4, disaggregate=True, prefill_ranks=1,
             decode_ranks=2) as llm:
        sink = EventList()
        llm.tracer.add_sink(sink)
        prompts = [[5 + i for i in range(n)] for n in (21, 26)]
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                            trace_level="basic")
    events = [e.to_dict() for e in sink.events]
    moved = {e["request_id"]: e for e in events if e["type"] == "kv.transfer"}
    assert sorted(x["dst"] for x in moved.values()) == ["decode 0", "decode 1"]
    for out in outs:
        rid, x = out.request_id, moved[out.request_id]
        free = next(i for i, e in enumerate(events) if e["type"] == "kv.free" and e["request_id"] == rid
                    and e.get("engine") == "decode")
        mine = [e for e in events[:free] if e["request_id"] == rid or rid in e.get("request_ids", ())]
        v = LiveView(model={**MODEL, "num_blocks": x["dst_pool"]["num_blocks"]}, piece=str, is_special=lambda i: False)
        v.request_id = rid
        v.add(mine)  # everything up to its blocks' release on the decode side
        html = v.render("kv")
        table = re.search(r"block table: ([\d, ]+) ·", html)
        listed = [int(b) for b in table[1].split(", ")] if table else []
        assert listed[:len(x["dst_blocks"])] == x["dst_blocks"], (x, html[:400])  # the pages it was handed, and more
        held = int(re.search(r'data-mine="(\d+)"', html)[1]) + int(re.search(r'data-shared="(\d+)"', html)[1])
        assert held > 0, (x["dst"], html)  # its own blocks, on its own decode engine's grid
