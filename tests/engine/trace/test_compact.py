"""The compact form of a trace's big captures (engine/trace/compact.py writes it,
visualizers/compact.py reads it): the same levels on both sides, the page's picture and
printed weights within their stated bounds, the readers' per-layer and per-row views of
both the compact and the older list forms, and a real trace that decodes to what the
list form of the same run holds."""
import json

import numpy as np
import pytest
import torch

from engine import CaptureConfig, EventList, SamplingParams, Tracer
from engine.llm_engine import DEFAULT_MODEL, LLMEngine
from engine.trace import compact
from visualizers import compact as reader
from visualizers._html import colormap


def test_writer_and_reader_share_one_table_of_levels():
    assert len(compact.LEVELS) == 255 and compact.LEVELS[0] == 0.0 and compact.LEVELS[-1] == 1.0
    np.testing.assert_array_equal(compact.LEVELS.astype(np.float32), reader.LEVELS)
    steps = np.diff(np.sqrt(compact.LEVELS))
    assert steps.max() <= compact.SQRT_STEP + 1e-12  # the picture's colour steps
    assert np.diff(compact.LEVELS).max() <= compact.P_STEP + 1e-12  # the printed weights' steps


def test_attention_keeps_the_picture_and_the_weights():
    """Every p in [0, 1]: the page colours sqrt(p) (visualizers/attention.py) within 4 of 255 in
    each channel of the exact colour, and a weight read back is within 0.002."""
    p = torch.linspace(0, 1, 100_001, dtype=torch.float64) ** 2
    form = compact.encode_probs(p)
    assert form["enc"] == "p8" and form["shape"] == [100_001] and isinstance(form["data"], str)
    back = reader.array(form).astype(np.float64)
    assert np.abs(back - p.numpy()).max() <= 0.002 + 1e-6
    exact, shown = colormap(np.sqrt(p.numpy())).astype(int), colormap(np.sqrt(back)).astype(int)
    assert np.abs(exact - shown).max() <= 4
    json.dumps(form)  # plain JSON


def test_embedding_rows_keep_three_significant_digits():
    rows = torch.randn(5, 64, generator=torch.Generator().manual_seed(0)) * 3
    form = compact.encode_rows(rows)
    back = reader.array(form)
    assert form["enc"] == "f16" and back.shape == (5, 64)
    np.testing.assert_allclose(back, rows.numpy(), rtol=1e-3, atol=1e-4)
    assert reader.dense(form) == np.round(back.astype(np.float64), 4).tolist()


def test_readers_take_both_forms():
    lists = [[[0.5, 0.5]], [[1.0, 0.0]]]  # [heads, rows, keys]: an older trace's, one layer
    assert reader.dense(lists) is lists and reader.array(lists).shape == (2, 1, 2)
    old = {"layer": 3, "window": None, "kind": "decode", "probs": lists}
    probs = torch.tensor([[[[0.25, 0.75]]], [[[1.0, 0.0]]]])  # [layers, heads, rows, keys]
    new = {"layers": [0, 5], "windows": [None, 512], "kind": "decode", "q_start": 1, "k_start": 0,
           "probs": compact.encode_probs(probs)}
    split = reader.per_layer([old, new])
    assert [(e["layer"], e["window"]) for e in split] == [(3, None), (0, None), (5, 512)]
    assert split[0] is old and all(e["q_start"] == 1 and e["kind"] == "decode" for e in split[1:])
    np.testing.assert_allclose(np.asarray(split[2]["probs"]), probs[1].numpy(), atol=0.002)
    assert reader.array(new["probs"]) is reader.array(dict(new["probs"]))  # decoded once, then reused


def test_lens_rows_from_columns_or_from_an_older_trace():
    cols = {"token_id": 7, "top_ids": [[7, 2], [2, 7]], "top_probs": [[0.6, 0.3], [0.5, 0.4]],
            "chosen_rank": [1, 2], "chosen_prob": [0.6, 0.4], "texts": {"7": " Paris", "2": "<b>"}}
    rows = reader.lens_layers(cols)
    assert rows == [{"top_ids": [7, 2], "top_probs": [0.6, 0.3], "top_texts": [" Paris", "<b>"], "chosen_rank": 1,
                     "chosen_prob": 0.6},
                    {"top_ids": [2, 7], "top_probs": [0.5, 0.4], "top_texts": ["<b>", " Paris"], "chosen_rank": 2,
                     "chosen_prob": 0.4}]
    assert reader.lens_layers({"layers": rows}) is rows


@pytest.fixture(scope="module")
def both_forms():
    """The embedded model, the same greedy request traced compactly and as lists."""
    out = []
    for compact_form in (True, False):
        sink = EventList()
        engine = LLMEngine(DEFAULT_MODEL, device="cpu", tracer=Tracer(sink), trace_level="full",
                           capture=CaptureConfig(compact=compact_form))
        rid = engine.add_request("Once upon a time", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
        out.append([e.to_dict() for e in sink.of(rid)])
    return out


def test_a_compact_trace_reads_back_as_the_list_form_does(both_forms):
    small, big = both_forms
    for kind, key, tol in (("attention", "probs", 0.0021), ("embed", "rows", 2e-3)):
        # by step: which steps' captures were built live (the rest after the answer) depends on time
        a = sorted((e for e in small if e["type"] == kind), key=lambda e: e["step"])
        b = sorted((e for e in big if e["type"] == kind), key=lambda e: e["step"])
        assert len(a) == len(b) > 1 and all(reader.is_compact(e[key]) for e in a)
        assert not any(reader.is_compact(e[key]) for e in b)
        for x, y in zip(a, b):
            np.testing.assert_allclose(reader.array(x[key]), np.asarray(y[key], dtype=np.float32), atol=tol, rtol=1e-3)
    size = lambda evs, kind: sum(len(json.dumps(e)) for e in evs if e["type"] == kind)  # noqa: E731
    assert size(small, "attention") * 3 < size(big, "attention")


def test_one_attention_event_a_pass_holds_every_layer(both_forms):
    small, _ = both_forms
    passes = [e for e in small if e["type"] == "attention"]
    steps = [e["step"] for e in passes]
    assert len(steps) == len(set(steps)) == 8  # the prefill and 7 decode steps: one event each
    layers = passes[0]["layers"]
    assert layers == list(range(len(layers))) and len(passes[0]["windows"]) == len(layers)
    assert all(e["probs"]["shape"][:2] == [len(layers), e["num_heads"]] for e in passes)
