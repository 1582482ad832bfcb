"""The RoPE tables (engine/layers/rotary.py) hold INITIAL_ROWS positions at load and grow to the
longest pass: the same tokens as tables built whole, and the rows equal a whole table's."""
from __future__ import annotations

import pytest
import torch

from engine import LLM
from engine.layers import rotary
from engine.sampling_params import SamplingParams


@pytest.mark.parametrize("arch", ["llama", "gemma3"])  # gemma3: its local table grows too
def test_tables_grow_with_the_longest_pass_and_change_no_token(checkpoint, monkeypatch, arch):
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompt = list(range(3, 23))
    whole = LLM(checkpoint(arch), device="cpu", dtype="float32").generate([prompt], greedy)[0].token_ids
    monkeypatch.setattr(rotary, "INITIAL_ROWS", 8)
    llm = LLM(checkpoint(arch), device="cpu", dtype="float32")
    model = llm.engine.runner.model.model
    tables = [t for t in (model.rotary, model.rotary_local) if t is not None]
    assert all(t.cos.shape[0] == 8 for t in tables)  # not max_model_len's rows at load
    assert llm.generate([prompt], greedy)[0].token_ids == whole
    for t in tables:
        rows = t.cos.shape[0]
        assert len(prompt) + 12 - 1 <= rows < t.max_positions
        full = rotary.RotaryEmbedding(t.cos.shape[1], t.max_positions, 10000.0, None)
        full.inv_freq, full.factor = t.inv_freq, t.factor
        cos, sin = full._tables(t.max_positions, torch.device("cpu"))
        assert torch.equal(t.cos, cos[:rows]) and torch.equal(t.sin, sin[:rows])


def test_a_table_never_grows_past_max_positions():
    t = rotary.RotaryEmbedding(8, 20, 10000.0, None)
    assert t.cos.shape == (20, 8)
    t.cover(50)
    assert t.cos.shape == (20, 8)
