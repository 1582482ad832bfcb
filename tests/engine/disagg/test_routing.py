"""engine/disagg/routing.py: which prefill engine computes a prompt (the fewest prefill tokens to
compute there, its cached prefix counted) and which decode engine receives the pages (the most
free blocks where they fit). Pure: no process starts."""
from __future__ import annotations

from engine.disagg.routing import PrefillRouter, block_hashes, pick_decode

BS = 4
BASE = list(range(10, 47))  # 37 tokens: 9 full blocks


def test_with_nothing_cached_the_least_outstanding_prefill_tokens_win():
    r = PrefillRouter(3, capacity_blocks=64, block_size=BS)
    a = r.route("a", list(range(100, 140)))  # 40 tokens
    b = r.route("b", list(range(200, 210)))  # 10
    c = r.route("c", list(range(300, 320)))  # 20
    d = r.route("d", list(range(400, 405)))  # 5: engine 1 has 10 outstanding, 2 has 20, 0 has 40
    assert [x.index for x in (a, b, c, d)] == [0, 1, 2, 1]  # a tie goes to the lowest index
    assert [e.outstanding for e in r.engines] == [40, 15, 20]
    r.answered("a")  # prefilled: no longer outstanding there
    r.answered("a")  # twice (a READY after a DROP): counted once
    assert [e.outstanding for e in r.engines] == [0, 15, 20]
    assert r.route("e", list(range(500, 530))).index == 0


def test_a_cached_prefix_wins_unless_its_engine_is_busier_than_the_prefix_saves():
    r = PrefillRouter(2, capacity_blocks=64, block_size=BS)
    assert r.route("first", BASE).index == 0
    assert r.route("other", list(range(600, 604))).index == 1  # 4 tokens, engine 0 busy with 37
    r.answered("first")  # engine 0: 0 outstanding, BASE's 9 blocks cached; engine 1: 4 outstanding
    # shares 5 blocks (20 tokens) with BASE: engine 0 computes 5 of its 25, engine 1 would compute 25
    again = r.route("again", BASE[:20] + [1, 2, 3, 4, 5])
    assert (again.index, again.cached_tokens, again.cost) == (0, 20, 5)
    # the same prompt: at most (37 - 1) // 4 blocks cached (one token is always computed)
    same = r.route("same", BASE)
    assert (same.index, same.cached_tokens) == (0, 36)
    # engine 0 has 5 + 1 outstanding, engine 1 has 4; a prompt sharing one block with BASE costs
    # 6 + (8 - 4) there, 4 + 8 on engine 1: its 4 cached tokens outweigh engine 0's extra 2
    assert r.route("short", BASE[:4] + [7] * 4).index == 0
    # sharing nothing: the least outstanding (engine 1: 4, engine 0: 10)
    assert r.route("fresh", list(range(700, 712))).index == 1


def test_the_record_forgets_the_oldest_blocks_past_an_engines_pool():
    r = PrefillRouter(1, capacity_blocks=3, block_size=BS)
    r.route("a", BASE)  # 9 full blocks: only the last 3 hashes kept
    assert len(r.engines[0].cached) == 3
    assert r.engines[0].cached_tokens(block_hashes(BASE, BS), len(BASE), BS) == 0  # its first block is gone
    # chained: the same block after a different prefix is another hash
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 8], BS)[1] != block_hashes([9, 9, 9, 9, 5, 6, 7, 8], BS)[1]


def test_the_decode_engine_with_the_most_free_blocks_where_they_fit():
    assert pick_decode([10, 30, 30], 5) == 1  # a tie: the lowest index
    assert pick_decode([10, 3], 5) == 0
    assert pick_decode([4, 3], 5) is None  # fits nowhere: it waits
