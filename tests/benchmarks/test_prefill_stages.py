"""benchmarks/prefill_stages.py: the stages of a TTFT as disjoint parts that add up to it, on the
embedded model (timings are noise here: only their shape and sum are checked), the timers gone after."""
from __future__ import annotations

from benchmarks import prefill_stages
from engine.layers import fused
from engine.llm_engine import DEFAULT_MODEL, LLMEngine


def test_the_stages_add_up_to_the_ttft_and_the_timers_are_removed(capsys):
    real = fused.stack_forward
    rows = prefill_stages.main(["--model", str(DEFAULT_MODEL), "--dtypes", "float32", "--lengths", "5,40",
                                "--rounds", "1", "--threads", "1", "--clock", "cpu"])
    assert [(r["dtype"], r["tokens"]) for r in rows] == [("float32", 5), ("float32", 40)]
    for r in rows:
        stages = r["stages_ms"]
        assert abs(sum(stages.values()) - r["timed_ms"]) < 0.1  # disjoint parts (rounded to 0.01 ms): they add up
        assert min(stages.values()) >= -0.01, stages  # a nested part less what it holds: never negative
        assert stages["tokenize"] > 0 and stages["LM head"] > 0 and stages["sampling"] > 0
        assert stages["layers fused in C"] > 0 or stages["qkv matmul"] > 0  # the layers ran one way or the other
    assert fused.stack_forward is real
    out = capsys.readouterr().out
    assert "TTFT (median, no timers)" in out and "attention (less qkv, o)" in out


def test_a_timer_leaves_the_engine_as_it_was():
    engine = LLMEngine(DEFAULT_MODEL, device="cpu")
    model = engine.runner.model
    timer = prefill_stages.StageTimer(engine, lambda: 0.0)
    timer.install()
    assert "_schedule" in vars(engine) and model.lm_head._forward_hooks
    timer.remove()
    assert "_schedule" not in vars(engine) and "run" not in vars(engine.runner) and not model.lm_head._forward_hooks
