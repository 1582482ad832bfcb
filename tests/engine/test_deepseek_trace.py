"""A full trace of a DeepSeek model records what its router did beyond the picks: the
chosen experts' scores before and after V3's balance bias, the experts it would have picked
without the bias, the expert groups kept, and the routing's rules (shared experts, groups,
scoring) — checked against transformers' own DeepseekV3TopkRouter on the same hidden states."""
from __future__ import annotations

import pytest
import torch

from engine import EventList, SamplingParams, Tracer
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from tests.deepseek_tiny import make_deepseek
from tests.engine_utils import DEVICE
from tests.tiny import load_reference

PROMPT = torch.randint(4, 300, (13,), generator=torch.Generator().manual_seed(5)).tolist()


@pytest.fixture(scope="module")
def v3(tmp_path_factory):
    return make_deepseek("v3_moe", tmp_path_factory.mktemp("v3"))


def traced(path, max_tokens: int = 4):
    sink = EventList()
    engine = LLMEngine(path, device=DEVICE, tracer=Tracer(sink), trace_level="off",
                       config=EngineConfig(block_size=4, max_num_batched_tokens=8))
    rid = engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                             trace_level="full")
    while engine.has_unfinished_requests():
        engine.step()
    return PROMPT + engine.get_output(rid).token_ids[:-1], [e.data for e in sink.of(rid, "moe")]


def router_reference(path, tokens):
    """Per MoE layer: transformers' router on the hidden states its model sends it, with the
    file's bias and with the bias set to zero. -> layer -> (scores [T, E], biased picks, unbiased picks)"""
    ref = load_reference(path)
    inputs: dict[int, torch.Tensor] = {}
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, a, out, i=i: inputs.__setitem__(i, a[0].reshape(
        -1, a[0].shape[-1]))) for i, layer in enumerate(ref.model.layers) if hasattr(layer.mlp, "gate")]
    with torch.no_grad():
        ref(torch.tensor([tokens]))
        for h in hooks:
            h.remove()
        out = {}
        for i, x in inputs.items():
            gate = ref.model.layers[i].mlp.gate
            scores = torch.sigmoid(x.float() @ gate.weight.float().T)
            picked = gate(x)[-1]
            bias = gate.e_score_correction_bias.clone()
            gate.e_score_correction_bias.zero_()
            unbiased = gate(x)[-1]
            gate.e_score_correction_bias.copy_(bias)
            out[i] = scores, scores + bias, picked, unbiased
    return out


def test_v3_router_detail_matches_transformers(v3):
    tokens, moe = traced(v3)
    reference = router_reference(v3, tokens)
    assert {e["layer"] for e in moe} == {1, 2} == set(reference)
    kinds = set()
    for e in moe:
        scores, biased, picked, unbiased = reference[e["layer"]]
        assert e["deepseek"] == {"shared_experts": 1, "scoring": "sigmoid", "n_group": 4, "topk_group": 2,
                                 "correction_bias": True, "routed_scaling_factor": 2.5}
        kinds.add(len(e["experts"]) > 1)
        for i, experts in enumerate(e["experts"]):
            p = e["start"] + i
            assert sorted(experts) == sorted(picked[p].tolist())
            torch.testing.assert_close(torch.tensor(e["scores"][i]), scores[p, experts], atol=1e-4, rtol=0)
            torch.testing.assert_close(torch.tensor(e["biased"][i]), biased[p, experts], atol=1e-4, rtol=0)
            assert e["without_bias"][i] == sorted(unbiased[p].tolist())
            # the kept groups hold every pick; their number is topk_group
            assert len(e["groups"][i]) == 2 and {x // 2 for x in experts} <= set(e["groups"][i])
    assert kinds == {True, False}  # prefill chunks and single-token decodes both carry the fields
    # the bias changed some choice in this checkpoint (else "without the bias" shows nothing)
    assert any(sorted(ex) != wb for e in moe for ex, wb in zip(e["experts"], e["without_bias"]))


def test_v2_events_carry_groups_and_softmax_scores(tmp_path):
    """V2's group-limited greedy routing: groups kept, softmax scores of the picks, no bias fields."""
    path = make_deepseek("v2_groups_yarn", tmp_path)
    _, moe = traced(path, max_tokens=2)
    assert moe and all(e["deepseek"]["scoring"] == "softmax" and not e["deepseek"]["correction_bias"] for e in moe)
    for e in moe:
        assert "biased" not in e and "without_bias" not in e
        for experts, groups, scores, weights in zip(e["experts"], e["groups"], e["scores"], e["weights"]):
            assert {x // 2 for x in experts} <= set(groups) and len(groups) == 2
            assert all(0 < s < 1 for s in scores)
            # weights: the scores renormalised (norm_topk_prob is off for V2 here) times routed_scaling_factor
            assert weights == pytest.approx([s * 1.5 for s in scores], abs=2e-3)


def test_models_without_deepseek_moe_keep_their_event_shape(tmp_path):
    from tests.tiny import make_checkpoint
    path = make_checkpoint("qwen3_moe", tmp_path)
    _, moe = traced(path, max_tokens=2)
    assert moe and all(set(e) == {"layer", "start", "experts", "weights", "num_experts", "top_k", "batch_load"}
                       for e in moe)
