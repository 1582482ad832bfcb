"""DeepSeek V2 / V3 on two ranks (CPU, gloo): multi-head latent attention split by query
heads with the whole latent on every rank, DeepSeek MoE split by columns (tensor parallel)
or by whole routed experts (expert parallel, the router whole on every rank): the same
logits, greedy tokens and captured attention as one device; splits that do not work refused."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import ModelConfig
from engine.forward import prompt_logits
from engine.parallel.shard import check_shardable
from tests.deepseek_tiny import BASE, make_deepseek
from visualizers.compact import array, per_layer

GEN = torch.Generator().manual_seed(7)
PROMPTS = [torch.randint(4, 300, (n,), generator=GEN).tolist() for n in (21, 9)]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

# V3 with q_lora_rank, groups and the bias (TP and EP); V2-Lite's shape (one q_proj, 2 shared experts) with EP
CASES = [("v3_moe", False), ("v3_moe", True), ("v2_lite", True)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made = {}

    def get(variant):
        if variant not in made:
            made[variant] = make_deepseek(variant, tmp_path_factory.mktemp(variant))
        return made[variant]
    return get


@pytest.mark.slow  # 2 worker processes
@pytest.mark.parametrize("variant,ep", CASES, ids=[f"{v}-{'ep' if ep else 'tp'}" for v, ep in CASES])
def test_two_ranks_match_one_device(folders, variant, ep):
    path = folders(variant)
    one = LLM(path, device="cpu", dtype="float32", block_size=4)
    two = LLM(path, device="cpu", dtype="float32", block_size=4, tensor_parallel_size=2, expert_parallel=ep)
    try:
        for chunk in (None, 1, 5):  # prefill rebuilding K/V per head, and the absorbed decode
            torch.testing.assert_close(prompt_logits(two.engine, PROMPTS[0], chunk),
                                       prompt_logits(one.engine, PROMPTS[0], chunk), atol=1e-4, rtol=1e-4)
        assert [o.token_ids for o in two.generate(PROMPTS, GREEDY)] == \
            [o.token_ids for o in one.generate(PROMPTS, GREEDY)]
        _check_placement(one, two, ep)
        if not ep:
            _check_attention_and_routing(one, two)
    finally:
        two.shutdown()


def _check_placement(one: LLM, two: LLM, ep: bool) -> None:
    """Rank 0 holds half the query heads and the whole latent (its pool's rows are as wide as
    one device's); with EP half the routed experts, whole, and the router over all of them."""
    cfg, runner = one.engine.model_config, two.engine.runner
    mla = runner.model.model.layers[1].self_attn
    assert mla.num_heads == cfg.num_heads // 2
    assert tuple(runner.kv_cache.shape[-2:]) == (1, cfg.mla.latent_dim)
    assert runner.kv_cache.shape[0] == 1  # one latent, no K/V pair
    ranks = runner.placement.as_dict()["ranks"]
    H = cfg.num_heads
    assert [r["heads"] for r in ranks] == [list(range(H // 2)), list(range(H // 2, H))]
    assert [r["kv_heads"] for r in ranks] == [[0], [0]]  # the latent: replicated
    moe = runner.model.model.layers[1].mlp.inner
    E = cfg.num_experts
    assert moe.gate.weight.shape[0] == E
    # the C kernels' blocked experts are their only copy where they were packed (engine/layers/moe_cpu.py)
    gate_up = moe.experts_gate_up if moe.experts_gate_up is not None else moe.c_experts.unblocked()[0]
    if ep:
        assert gate_up.shape[0] == E // 2
        assert [r["experts"] for r in ranks] == [list(range(E // 2)), list(range(E // 2, E))]
    else:
        assert gate_up.shape == (E, cfg.moe_intermediate_size, cfg.hidden_size)  # 2 x I/2 rows
    kv = two.engine.describe().kv_pool
    assert kv.stores == "latent" and kv.values_per_token_layer == cfg.mla.latent_dim


def _check_attention_and_routing(one: LLM, two: LLM) -> None:
    """A full trace of the sharded request: every head's attention (each rank scores its heads
    against its own copy of the latent) and DeepSeek's routing fields, as on one device."""
    def events(llm, kind):  # by the pass's first row: a live step's (the last one's too) may come before others
        got = [e.data for e in llm.stream(PROMPTS[1], SamplingParams(temperature=0, max_tokens=3), trace="full")
               if getattr(e, "type", None) == kind]
        return sorted(got, key=lambda d: (d.get("q_start", d.get("start", 0)), d.get("layer", 0)))
    a, b = per_layer(events(one, "attention")), per_layer(events(two, "attention"))
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert (x["layer"], x["heads"], x["q_start"]) == (y["layer"], y["heads"], y["q_start"])
        torch.testing.assert_close(torch.from_numpy(array(y["probs"]).copy()),
                                   torch.from_numpy(array(x["probs"]).copy()), atol=4.1e-3, rtol=0)
    # the parallelism panel and classroom stage 13 say the heads are split and the latent is whole on each rank
    from visualizers.parallel import measured_stage_html, parallel_panel_html
    cols = [e.to_dict() for e in two.stream(PROMPTS[0], SamplingParams(temperature=0, max_tokens=2), trace="basic")
            if getattr(e, "type", None) == "schedule.collective"]
    assert cols and cols[0]["placement"]["latent"] is True
    panel = parallel_panel_html(cols, one.engine.model_config.num_layers)
    assert "attention split by query heads" in panel and "keeps the whole latent" in panel
    assert "rank 1: query heads 2–3, the whole latent" in measured_stage_html(cols)
    ma, mb = events(one, "moe"), events(two, "moe")
    assert [(e["layer"], e["experts"], e["groups"], e["without_bias"]) for e in ma] == \
        [(e["layer"], e["experts"], e["groups"], e["without_bias"]) for e in mb]


@pytest.mark.parametrize("bad,ep,message", [
    ({"num_attention_heads": 3, "num_key_value_heads": 3}, False, "does not divide the model's 3 attention heads"),
    ({"n_routed_experts": 6, "n_group": 1, "topk_group": 1}, True, None),  # 6 experts over 2 ranks: fine
    ({"n_routed_experts": 3, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 1}, True,
     "needs a number of routed experts that 2 divides"),
    ({"moe_intermediate_size": 33}, False, "moe_intermediate_size \\(33\\)"),
])
def test_splits_that_do_not_work_are_refused(bad, ep, message):
    cfg = ModelConfig.from_hf({"architectures": ["DeepseekV3ForCausalLM"], **BASE, "n_routed_experts": 8,
                               "n_group": 4, "topk_group": 2, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
                               **bad})
    if message is None:
        check_shardable(cfg, 2, ep)
        return
    with pytest.raises(ValueError, match=message):
        check_shardable(cfg, 2, ep)


def test_sizes_offered_are_the_head_splits():
    from engine.info import split_sizes
    cfg = ModelConfig.from_hf({"architectures": ["DeepseekV3ForCausalLM"], **BASE, "n_routed_experts": 8,
                               "n_group": 4, "topk_group": 2, "num_experts_per_tok": 2, "first_k_dense_replace": 1})
    assert split_sizes(cfg) == [2, 4]  # 4 heads; moe_intermediate_size 32, intermediate 96
