"""Precision on the embedded model at size ci: float32 agrees with itself, quantized weights
take fewer bytes, and the comparison reads the engine's prompt logprobs."""
import math

import pytest

from app.lab import run
from app.lab.precision import kl_top
from tests.app.lab.english_left import left_in_chinese


@pytest.fixture(scope="module")
def result():
    return run("precision", size="ci", repeats=1).to_json()  # counts: one run says them


def test_quantized_weights_are_smaller_and_close_to_float32(result):
    m = {s["setting"]["name"]: s["metrics"] for s in result["settings"]}
    assert m["float32"]["agreement"] == 1.0 and m["float32"]["kl_mean"] == 0.0
    assert m["int4"]["quantized_bytes"] < m["int8"]["quantized_bytes"]
    assert m["int8"]["weights_bytes"] < m["float32"]["weights_bytes"]
    assert m["int4"]["weights_bytes"] < m["float32"]["weights_bytes"]
    for name in ("int8", "int4"):
        assert 0.5 <= m[name]["agreement"] <= 1.0 and m[name]["kl_mean"] > 0
    assert m["int8"]["kl_mean"] < m["int4"]["kl_mean"]  # four bits lose more than eight
    text = result["settings"][0]["setting"]["options"]["text_tokens"]
    assert all(x["positions"] == text - 1 for x in m.values())  # every prompt position but the first


def test_kl_top_is_zero_for_the_same_distribution_and_grows_apart():
    p = [[1, math.log(0.6)], [2, math.log(0.3)]]
    assert kl_top(p, p) == pytest.approx(0.0, abs=1e-12)
    q = [[2, math.log(0.6)], [1, math.log(0.3)]]
    exact = 0.6 * math.log(0.6 / 0.3) + 0.3 * math.log(0.3 / 0.6)  # the rest (0.1) is equal
    assert kl_top(p, q) == pytest.approx(exact)


def test_the_sentences_say_the_moe_experts_stayed_float(result):
    """The embedded model is a MoE: the engine quantizes its linear layers only, so the weights
    left blocked for the float kernels are its experts, and the sentence says so with the share."""
    m = {s["setting"]["name"]: s["metrics"] for s in result["settings"]}
    f32 = m["float32"]["weights_bytes"]
    assert m["float32"]["num_experts"] > 0 and m["float32"]["left_float_share"] == 0.0
    for name in ("int8", "int4"):
        share = m[name]["left_float_share"]
        assert share == m[name]["kernel_weight_bytes"] / f32 and 0.5 < share < 1
    for said, name in zip(result["sentences"], ("int8", "int4")):
        assert f"the MoE experts, {m[name]['left_float_share']:.0%} of float32's weight bytes, stayed float32" in said
        assert "no option for the experts" in said


def test_the_result_drawn_in_chinese_leaves_no_english(result):
    assert not left_in_chinese(result), left_in_chinese(result)
