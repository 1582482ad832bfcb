"""The walkthrough's words for a DeepSeek model (page and classroom read the same stages):
the layers stage speaks of multi-head latent attention and DeepSeek's routing with this
request's numbers, the KV stage of the latent the pool keeps (measured from the pool, and
what full K and V would take) instead of 2 x KV heads x head_dim."""
from __future__ import annotations

import html
import re

import pytest

from tests.deepseek_tiny import make_deepseek
from tests.service_utils import app_service, record_run, started, walk

pytestmark = pytest.mark.slow  # the app's service on a tiny DeepSeek model


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    path = make_deepseek("v3_moe", tmp_path_factory.mktemp("v3"))
    with started(app_service(lambda _: path, "--draft", "none", "--block-size", "4")) as svc:
        yield record_run(svc, "What is a latent?", max_tokens=6, speculative=False)


def text(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


def test_layers_stage_names_mla_and_deepseek_routing(rec):
    words = text(walk(rec)["layers"])
    assert "multi-head latent attention (MLA)" in words
    assert "one latent of 16 numbers plus a 4-number RoPE key that every head shares" in words
    assert "multi-query attention" not in words  # num_kv_heads is 1, but no head's K/V is cached
    assert "every token also passes through 1 shared expert" in words
    assert "only from the 2 best of 4 expert groups; here the tokens kept groups" in words
    changed = re.search(r"the bias changed the picks of (\d+) of (\d+) tokens", words)
    assert changed
    moe = [e for e in rec.events if e["type"] == "moe" and e["layer"] == 1]
    pairs = [(sorted(x), w) for e in moe for x, w in zip(e["experts"], e["without_bias"])]
    assert (int(changed.group(1)), int(changed.group(2))) == (sum(x != w for x, w in pairs), len(pairs))


def test_kv_stage_quotes_the_latent_from_the_pool(rec):
    words = text(walk(rec)["kv"])
    # 3 layers x (16 + 4) numbers x 4 bytes (float32): the pool's bytes_per_token
    assert rec.model["kv_bytes_per_token"] == 240 and rec.model["kv_stores"] == "latent"
    assert "keeps the latent, not K and V: 3 layers × 20 numbers (16 latent + 4 RoPE key) × 4 bytes = 240 bytes" \
        in words
    assert "full keys and values for its 4 heads would take 1,152 bytes (5× more)" in words
    assert re.search(r"this request held latents for \d+ tokens: .* \(K and V would have taken .*\)", words)
    assert "2 × 3 layers × 1 KV head" not in words


def test_kv_panel_formula_is_the_latent_measured_from_the_pool(rec):
    from visualizers.kv_cache import kv_formula_html
    words = text(kv_formula_html(rec.model, 10))
    assert "KV bytes = layers × (kv_lora_rank + qk_rope_head_dim) × tokens × bytes_per_value" in words
    assert "this model: 3 × (16 + 4) × tokens × 4 B (float32) = 240 B per token, the pool's own count " \
           "(the calculator's formula gives the same)" in words
    assert "latent: 20 numbers a token a layer (1/5 of full K and V: 1,152 B a token for 4 heads × (12 + 12) dims)" \
        in words
    assert "this request: 240 B × 10 tokens = 2.3 KiB" in words
    assert "2 × 3 × 1" not in words


def test_the_model_line_says_the_heads_read_one_latent(rec):
    from app.page.texts import model_summary
    line = text(model_summary(rec.model))
    assert "4 query heads over one 20-number latent (MLA)" in line and "1 KV heads" not in line
