"""benchmarks/deepseek.py's byte counts: the latent per token equals the pool's own count,
full K and V and the GQA comparator follow their formulas, DeepSeek-V3's row is the issue's
70 KB a token, and one decode step's weight bytes leave out the experts not routed to."""
from __future__ import annotations

import pytest

from benchmarks.deepseek import DEEPSEEK_V3, TINY, kv_row, report, tiny_checkpoint, weight_bytes_read
from engine.config import ModelConfig
from engine.llm_engine import LLMEngine
from tests.engine_utils import DEVICE


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("ds"))


@pytest.fixture(scope="module")
def engine(folder):
    return LLMEngine(folder, device=DEVICE, dtype="float32")


def test_v3_row_is_the_issue_arithmetic():
    row = kv_row("v3", ModelConfig.from_hf(DEEPSEEK_V3), 2, 8, 128)
    assert row.latent_bytes_per_token == 61 * 576 * 2 == 70_272
    assert row.full_kv_bytes_per_token == 61 * 128 * (192 + 128) * 2
    assert row.gqa_bytes_per_token == 2 * 61 * 8 * 128 * 2


def test_tiny_row_is_the_pool_count(engine):
    kv = engine.describe().kv_pool
    cfg = engine.model_config
    row = kv_row("tiny", cfg, kv.bytes_per_value, 4, 32)
    assert row.latent_bytes_per_token == kv.bytes_per_token == 4 * (64 + 16) * 4
    assert row.full_kv_bytes_per_token == kv.full_kv_bytes_per_token == 4 * 16 * (48 + 32) * 4


def test_weights_read_leave_out_unrouted_experts(engine, folder):
    from safetensors.torch import load_file
    # every weight of the checkpoint at float32, however the engine holds it (the C kernels'
    # blocked copies are the only ones where they run)
    total = sum(t.numel() * 4 for f in folder.glob("*.safetensors") for t in load_file(f).values())
    embed = TINY["vocab_size"] * TINY["hidden_size"] * 4
    # 3 MoE layers, 8 experts of gate+up+down (3 x 256 x 128 floats), 6 of them not read at top-2
    unrouted = 3 * 6 * 3 * 256 * 128 * 4
    assert weight_bytes_read(engine) == total - embed - unrouted


def test_report_lines():
    r = {"kv": [{"model": "m", "latent_bytes_per_token": 10, "full_kv_bytes_per_token": 40, "gqa_bytes_per_token": 20,
                 "gqa": "g"}], "context": 8, "weights_read_per_step": 100,
         "bytes_read_per_decode_step": {"mla": 180, "full_kv": 420, "gqa": 260},
         "decode": {"engine_tok_s": 4.0, "transformers_tok_s": 2.0, "greedy_tokens_identical": True, "spread": "s"},
         "device": "cpu"}
    text = report(r)
    assert "m: 10 B | 40 B (4.0x) | 20 B (2.0x; g)" in text
    assert "MLA 180 B, full K/V 420 B (2.33x), GQA 260 B (1.44x)" in text
    assert "engine 4.0 tok/s, transformers 2.0 tok/s (2.00x; s); greedy tokens identical" in text
