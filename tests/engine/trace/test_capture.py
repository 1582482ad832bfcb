"""A `full` trace's attention is recomputed after the forward pass (engine/trace/capture.py):
every captured row, in prefill chunks, decode steps and mixed batches, equals what
Hugging Face's eager attention computes over the same tokens, sliding windows included."""
import pytest
import torch

from engine import CaptureConfig, EventList, SamplingParams, Tracer
from engine.trace.capture import attention_probs
from visualizers.attention_rows import key_positions
from visualizers.compact import array, per_layer
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from tests.engine_utils import DEVICE
from tests.tiny import load_reference

PROMPT = torch.randint(4, 300, (21,), generator=torch.Generator().manual_seed(11)).tolist()


@pytest.mark.parametrize("arch,c_kernels", [("mistral", True), ("qwen2", True), ("mixtral", True),
                                             ("mistral", False)])
def test_captured_attention_equals_transformers(checkpoint, cpu_kernels_switch, arch, c_kernels):
    """(With the C kernels the probabilities are read from the pool in place, cpu_probs.c;
    without them from a gathered copy.)"""
    cpu_kernels_switch(c_kernels)
    sink = EventList()
    # a 7-token budget chunks the prompt; an untraced request shares every batch, first
    engine = LLMEngine(checkpoint(arch), device=DEVICE, tracer=Tracer(sink), trace_level="off",
                       config=EngineConfig(block_size=4, max_num_batched_tokens=7),
                       capture=CaptureConfig(heads=[0, 3], max_keys=6, embed_dims=8, compact=False))
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine.add_request(PROMPT[:5], greedy)
    rid = engine.add_request(PROMPT, greedy, trace_level="full")
    while engine.has_unfinished_requests():
        engine.step()
    tokens = PROMPT + engine.get_output(rid).token_ids[:-1]  # every token the model was fed
    with torch.no_grad():
        expected = load_reference(checkpoint(arch))(torch.tensor([tokens]), output_attentions=True).attentions
    passes = [e.data for e in sink.of(rid, "attention")]
    assert {e["kind"] for e in passes} == {"prefill", "decode"}
    assert len([e for e in passes if e["kind"] == "prefill"]) > 1  # the prompt in several chunks
    assert all(e["layers"] == [0, 1, 2] for e in passes)  # one event a pass, every layer in it
    # past max_keys the capture keeps the first keys (the attention sink) and the newest: 3 + 3 of 6
    assert {e["k_head"] for e in passes} == {0, 3} and all(e["k_head"] == 0 or e["k_start"] > 3 for e in passes)
    events = per_layer(passes)
    for e in events:
        probs = torch.tensor(e["probs"])
        rows, keys = probs.shape[1:]
        assert rows <= 6 and keys <= 6 and e["heads"] == [0, 3] and e["kv_heads"] == [0, 1]
        cols = key_positions(e["k_head"], e["k_start"], keys)  # the first keys, then the recent ones
        want = expected[e["layer"]][0, [0, 3], e["q_start"]:e["q_start"] + rows][..., cols]
        assert want.shape == probs.shape and e["k_start"] + keys - e["k_head"] == e["q_start"] + rows
        torch.testing.assert_close(probs, want, atol=2e-4, rtol=0)


def test_attention_probs_masks_per_layer_windows():
    """Two layers, one with a window of 2: rows over 5 keys, against a dense softmax."""
    torch.manual_seed(0)
    L, rows, H, kvh, D, ctx = 2, 3, 4, 2, 8, 5
    q, k = torch.randn(L, rows, H, D), torch.randn(L, ctx, kvh, D)
    got = attention_probs(q, k, ctx, 0.5, [None, 2])
    for layer, window in enumerate([None, 2]):
        for r in range(rows):
            pos = ctx - rows + r
            for h in range(H):
                scores = k[layer, :, h // 2] @ q[layer, r, h] * 0.5
                lo = 0 if window is None else pos - window + 1
                scores[pos + 1:] = float("-inf")
                scores[:lo] = float("-inf")
                torch.testing.assert_close(got[layer, h, r], torch.softmax(scores, 0))


def test_captured_verify_rows_equal_transformers(checkpoint):
    """Speculative verification passes (k+1 query rows) are captured like prefill chunks, in
    the compact form (engine/trace/compact.py: within 0.002 of the exact weights). The draft
    is the target itself, so every greedy proposal is accepted and the tokens each pass saw
    are the output's."""
    sink = EventList()
    target = checkpoint("mixtral")
    engine = LLMEngine(target, device=DEVICE, draft=target, num_speculative_tokens=3, tracer=Tracer(sink),
                       trace_level="full", config=EngineConfig(block_size=4),
                       capture=CaptureConfig(heads=[1, 2], max_keys=5))
    rid = engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=9, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    tokens = PROMPT + engine.get_output(rid).token_ids[:-1]
    with torch.no_grad():
        expected = load_reference(target)(torch.tensor([tokens]), output_attentions=True).attentions
    verify = [e.data for e in sink.of(rid, "attention") if e.data["kind"] == "verify"]
    assert verify and all(e["probs"]["enc"] == "p8" and e["probs"]["shape"][2] == 4 for e in verify)  # k + 1 rows
    for e in per_layer(verify):
        probs = torch.from_numpy(array(e["probs"]).copy())
        rows, keys = probs.shape[1:]
        cols = key_positions(e["k_head"], e["k_start"], keys)
        want = expected[e["layer"]][0, [1, 2], e["q_start"]:e["q_start"] + rows][..., cols]
        torch.testing.assert_close(probs, want, atol=2.1e-3, rtol=0)
