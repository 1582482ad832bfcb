"""Tensor and expert parallelism (engine/parallel) on the CPU: 2 ranks over gloo.

The sharded engine must compute what the single-device engine computes (itself checked
against transformers in test_parity.py): logits within float tolerance (the all-reduces
sum partial products in another order) and identical greedy tokens, on the embedded
Mixtral and on tiny Llama, Qwen3, Mixtral and Qwen2-MoE checkpoints. Plus the refusals,
the trace's collectives, and the failure paths: a rank that dies, a killed engine.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.forward import prompt_logits
from engine.parallel.runner import RankFailedError
from visualizers.parallel import measured_stage_html, parallel_panel_html, step_summary
from tests.paths import ROOT
from visualizers.compact import array, lens_layers, per_layer

EMBEDDED = ROOT / "assets" / "models" / "target"
PROMPTS = [torch.randint(4, 300, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (21, 9)]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


_single: dict = {}


def _engines(path, **parallel) -> tuple[LLM, LLM]:
    """The single-device engine (kept for the module) and a fresh 2-rank one."""
    if path not in _single:
        _single[path] = LLM(path, device="cpu", dtype="float32", block_size=4)
    two = LLM(path, device="cpu", dtype="float32", block_size=4, tensor_parallel_size=2, **parallel)
    return _single[path], two


# Experts split by columns run on the embedded model (a trained Mixtral), whole experts on
# the tiny Mixtral and on Qwen2-MoE, whose shared expert is split by columns like a dense MLP.
# The embedded model's TP engine also speculates (prompt lookup): its verify passes score
# k+1 positions per sequence on the ranks, and greedy output must still equal plain decoding.
CASES = [("llama", {}), ("qwen3", {}), ("mixtral", {"expert_parallel": True}),
         ("qwen2_moe", {"expert_parallel": True}), ("embedded", {"draft": "ngram"})]


@pytest.mark.slow  # 2 worker processes
@pytest.mark.parametrize("arch,parallel", CASES, ids=[a + ("-ep" if p.get("expert_parallel") else "-tp")
                                                      for a, p in CASES])
def test_two_ranks_match_one_device(checkpoint, arch, parallel):
    path = EMBEDDED if arch == "embedded" else checkpoint(arch)
    one, two = _engines(path, **parallel)
    try:
        workers = two.engine.runner.procs
        assert len(workers) == 1 and workers[0].is_alive()
        # logits of a whole prefill and of token-by-token decoding through each rank's KV pages
        ids = one.tokenizer.encode("Once upon a time, the little fox") if arch == "embedded" else PROMPTS[0]
        for chunk in (len(ids), 1):
            torch.testing.assert_close(prompt_logits(two.engine, ids, chunk), prompt_logits(one.engine, ids, chunk),
                                       atol=1e-4, rtol=1e-4)
        # greedy tokens of a batch of two prompts (prefill, then batched decode)
        prompts = [ids, PROMPTS[1]]
        assert [o.token_ids for o in two.generate(prompts, GREEDY)] == [o.token_ids for o in one.generate(prompts, GREEDY)]
        if "draft" in parallel:
            assert two.engine.stats.spec_proposed > 0  # the verify path ran sharded
        else:  # seeded sampling draws the same tokens too (speculation draws differently: not compared)
            sp = SamplingParams(temperature=0.8, top_p=0.95, seed=3, max_tokens=16, ignore_eos=True)
            assert two.generate(ids, sp)[0].token_ids == one.generate(ids, sp)[0].token_ids
        assert two.engine.block_manager.num_free_blocks == two.engine.block_manager.num_blocks
        if parallel.get("expert_parallel"):
            _check_expert_placement(one, two)
        if arch == "qwen3":
            _check_trace(two)
            _check_attention_capture(one, two)
    finally:
        two.shutdown()
    assert not any(p.is_alive() for p in workers)


def _check_expert_placement(one: LLM, two: LLM) -> None:
    """Rank 0 holds half the query and KV heads (whole GQA groups), KV pages of half the
    width, and half the experts, whole; the router still scores all of them."""
    cfg, runner = one.engine.model_config, two.engine.runner
    layer = next(i for i, m in enumerate(cfg.moe_layers) if m)
    attn = runner.model.model.layers[layer].self_attn
    assert (attn.num_heads, attn.num_kv_heads) == (cfg.num_heads // 2, cfg.num_kv_heads // 2)
    assert runner.kv_cache.shape[-2] == cfg.num_kv_heads // 2
    moe = runner.model.model.layers[layer].mlp.inner
    E = cfg.num_experts
    assert moe.experts_gate_up.shape[0] == E // 2 and moe.gate.out_features == E  # the gate: blocked, its only copy
    ranks = runner.placement.as_dict()["ranks"]
    assert [r["experts"] for r in ranks] == [list(range(E // 2)), list(range(E // 2, E))]
    H, K = cfg.num_heads, cfg.num_kv_heads
    assert [r["heads"] for r in ranks] == [list(range(H // 2)), list(range(H // 2, H))]
    assert [r["kv_heads"] for r in ranks] == [list(range(K // 2)), list(range(K // 2, K))]


def _check_attention_capture(one: LLM, two: LLM) -> None:
    """A `full` trace of a sharded request still shows every head's attention: each rank
    scores its own heads and rank 0 gathers them, equal to the single device's."""
    def events(llm):
        return [e for e in llm.stream(PROMPTS[1], SamplingParams(temperature=0, max_tokens=3), trace="full")
                if getattr(e, "type", None) in ("attention", "logit_lens")]
    ea, eb = events(one), events(two)
    # by the pass's first row: a live step's (the last one's too) may come before the steps between
    a, b = (per_layer(sorted((e.data for e in x if e.type == "attention"), key=lambda d: d["q_start"]))
            for x in (ea, eb))
    # the logit lens too: rank 0 reads the whole residual stream after each all-reduce
    la, lb = ([e.data for e in sorted(x, key=lambda e: e.data.get("position", 0)) if e.type == "logit_lens"]
              for x in (ea, eb))  # by position: a newest token's lens may come before its elders
    assert len(la) == len(lb) == 3 and all(len(lens_layers(x)) == one.engine.model_config.num_layers + 1 for x in lb)
    for x, y in zip(la, lb):
        assert [r["top_ids"][0] for r in lens_layers(x)] == [r["top_ids"][0] for r in lens_layers(y)]
        torch.testing.assert_close(torch.tensor([r["top_probs"] for r in lens_layers(y)]),
                                   torch.tensor([r["top_probs"] for r in lens_layers(x)]), atol=2e-3, rtol=0)
    cfg = one.engine.model_config
    assert len(a) == len(b) == 3 * cfg.num_layers  # every layer, at the prefill and two decodes
    for x, y in zip(a, b):
        assert (x["layer"], x["heads"], x["q_start"], x["k_start"]) == (y["layer"], y["heads"], y["q_start"], y["k_start"])
        assert len(y["probs"]) == cfg.num_heads
        # the same compact form from one device and from the gathered ranks: the same codes, but for a
        # weight on the edge of two levels (one level apart: at most 0.004)
        torch.testing.assert_close(torch.from_numpy(array(y["probs"]).copy()),
                                   torch.from_numpy(array(x["probs"]).copy()), atol=4.1e-3, rtol=0)


def _check_trace(llm: LLM) -> None:
    stream = list(llm.stream(PROMPTS[0], SamplingParams(temperature=0, max_tokens=3), trace="basic"))
    events = [e for e in stream if getattr(e, "type", None) == "schedule.collective"]
    steps = [e.data["num_tokens"] for e in stream if getattr(e, "type", None) == "schedule.step"]
    assert len(events) == len(steps) == 3  # one per step: the prefill (what the prefix cache lacks), two decodes
    assert steps[1:] == [1, 1]
    cfg = llm.engine.model_config
    for ev, tokens in zip(events, steps):
        cols = ev.data["collectives"]
        reduces = [c for c in cols if c["kind"] == "all_reduce"]
        # one after attention's o_proj and one after the MLP's down_proj, in every layer
        assert [(c["layer"], c["what"]) for c in reduces] == [
            (i, w) for i in range(cfg.num_layers) for w in ("attention", "mlp")]
        assert all(c["bytes"] == tokens * cfg.hidden_size * 4 for c in reduces)
        assert all(len(c["ms"]) == 2 and min(c["ms"]) >= 0 for c in cols)
        assert [c["what"] for c in cols if c["kind"] == "broadcast"] == ["batch"]
        ranks = ev.data["placement"]["ranks"]
        assert [r["kv_heads"] for r in ranks] == [[0], [1]] and [r["heads"] for r in ranks] == [[0, 1], [2, 3]]
    # the page's panel and classroom stage 13 quote these events
    dicts = [e.to_dict() for e in events]
    panel = parallel_panel_html(dicts, cfg.num_layers)
    assert panel.count("<td") == 2 * cfg.num_layers and "rank 1: compute" in panel and "not built" in panel
    assert step_summary(dicts[-1])["comm_ms"][0] == pytest.approx(
        sum(c["ms"][0] for c in dicts[-1]["collectives"] if c["kind"] == "all_reduce"))
    last = step_summary(dicts[-1])
    assert last["bytes"] == sum(c["bytes"] for c in dicts[-1]["collectives"]) and len(last["comm_ms"]) == 2
    stage = measured_stage_html(dicts)
    assert "ran sharded" in stage and f"{sum(len(d['collectives']) for d in dicts):,}</b> collectives" in stage


@pytest.mark.slow  # 2 worker processes
def test_the_app_serves_a_sharded_model_and_stage_13_quotes_it():
    """python -m app --tensor-parallel-size 2 --expert-parallel: the page's service runs a request
    on 2 ranks; its trace keeps the step's collectives, and classroom stage 13 quotes them."""
    from tests.service_utils import app_service, record_run, started, walk  # the app (gradio): only this test

    with started(app_service(None, "--tensor-parallel-size", "2", "--expert-parallel", model=None)) as svc:
        workers = svc.engine.runner.procs
        rec = record_run(svc, "Tell me a story.", max_tokens=6, speculative=False)
    assert not any(p.is_alive() for p in workers)
    sharded = [e for e in rec.events if e["type"] == "schedule.collective"]
    assert len(sharded) >= 6 and all(len(e["collectives"]) == 1 + 2 * rec.model["num_layers"] for e in sharded)
    text = walk(rec)["parallel"]
    assert "ran sharded" in text and "experts 4–7" in text and "Pipeline parallelism is not built" in text
    from app.serving.recording import ReplayCursor
    cursor = ReplayCursor(rec)  # the stage's panel, under its words: the measured grid
    panel = cursor.goto(cursor.last_frame).render("parallel")
    assert "<table class='tt-par-grid'" in panel and "Llama-3-70B" in panel
    # Perfetto: a track per rank with every collective; rank 0's lie inside its forward passes
    from visualizers.perfetto import RANK_TID, perfetto_trace, step_phases
    slices = [e for e in perfetto_trace(rec.events, rec.request_id)["traceEvents"] if e.get("cat") == "collective"]
    assert {e["tid"] for e in slices} == {RANK_TID, RANK_TID + 1}
    assert len(slices) == 2 * sum(len(e["collectives"]) for e in sharded)
    steps = {e["step"]: e for e in rec.events if e["type"] == "schedule.step"}
    for c in sharded:
        _, t0, t1 = next(p for p in step_phases(steps[c["step"]], 0) if p[0] == "forward")
        for col in c["collectives"]:
            assert t0 - 1e-3 <= col["start"][0] and col["start"][0] + col["ms"][0] / 1e3 <= t1 + 1e-3
    # the page's parallelism panel, at the request's last frame and at a mid one
    from app.serving.recording import ReplayCursor
    assert rec.model["tensor_parallel_size"] == 2 and rec.model["expert_parallel"]
    cursor = ReplayCursor(rec)
    last = cursor.goto(cursor.last_frame).render("parallel")
    assert "Parallelism" in last and "2 ranks, whole experts per rank" in last and "tt-par-grid" in last
    assert f"The last of {len(sharded)} steps" in last
    # replay step 1 is the request's first engine step (its arrival folded in), as the timeline counts
    assert "The last of 1 step " in cursor.goto(0).render("parallel")
    assert "The last of 2 steps" in cursor.goto(1).render("parallel")


def test_one_device_panel_says_what_is_not_built(tmp_path):
    html = parallel_panel_html([])
    assert "one device" in html and "Pipeline parallelism" in html and "not built" in html
    assert "Llama-3-70B" in html and "32.0 KiB" in html  # 2 x 8192 x 2 B per token per layer
    assert measured_stage_html([]) == ""
    from visualizers import parallel_html
    page = parallel_html([], {"tensor_parallel_size": 1, "num_layers": 4})
    assert "Parallelism" in page and "one device" in page
    # the size it suggests is one the engine accepts (SmolLM2's 3 KV heads: 3, not 2; Gemma 3 270M's 1: none)
    from engine.info import split_sizes
    from engine.checkpoint.resolve import load_config
    from tests.tiny import make_checkpoint
    kv3 = load_config(make_checkpoint("llama", tmp_path / "kv3", num_heads=9, num_kv_heads=3, hidden_size=72))
    assert split_sizes(kv3) == [3]
    assert "--tensor-parallel-size 3</code>" in parallel_html([], {"split_sizes": [3], "num_layers": 30})
    single = parallel_html([], {"split_sizes": [], "num_layers": 18})
    assert "cannot split it" in single and "--tensor-parallel-size" not in single
    sharded_off = parallel_html([], {"tensor_parallel_size": 2, "num_layers": 4}, level="off")
    assert "sharded over 2 ranks" in sharded_off and "capture level" in sharded_off


def test_refusals_are_clear_and_start_nothing(checkpoint, tmp_path):
    from tests.tiny import make_checkpoint
    import multiprocessing as mp

    odd = make_checkpoint("llama", tmp_path / "kv3", num_heads=9, num_kv_heads=3, hidden_size=72)
    with pytest.raises(ValueError, match=r"does not divide the model's 3 KV heads"):
        LLM(odd, device="cpu", dtype="float32", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="expert parallelism needs a mixture-of-experts model"):
        LLM(checkpoint("llama"), device="cpu", tensor_parallel_size=2, expert_parallel=True)
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1"):
        LLM(checkpoint("llama"), device="cpu", tensor_parallel_size=0)
    assert not mp.active_children()


@pytest.mark.slow  # 2 worker processes
def test_a_dying_rank_stops_the_engine_with_one_error(checkpoint, monkeypatch):
    llm = LLM(checkpoint("llama"), device="cpu", dtype="float32", block_size=4, tensor_parallel_size=2)
    runner = llm.engine.runner
    worker = runner.procs[0]
    assert llm.generate(PROMPTS[1], GREEDY)[0].finish_reason == "length"
    # no liveness check before the step: rank 0 learns of the death in a collective (gloo's error,
    # or the comm's watch of the ranks while it waits)
    monkeypatch.setattr(runner, "_check_workers", lambda: None)
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(5)
    t = time.monotonic()
    with pytest.raises(RankFailedError, match=r"rank 1 of 2 died \(exit code -9\)"):
        llm.generate(PROMPTS[0], GREEDY)
    assert time.monotonic() - t < 30
    with pytest.raises(RankFailedError, match="rank 1 of 2 died"):  # and stays stopped, saying why
        llm.generate(PROMPTS[0], GREEDY)
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks  # no page leaked
    llm.shutdown()


@pytest.mark.slow  # a worker process
def test_a_rank_gone_before_it_joins_the_group_stops_the_start_up_at_once(checkpoint, monkeypatch):
    """A worker whose process ends before it joins the process group (a Ctrl-C during its
    start-up, which it ignores only once it runs our code; a crash): the start-up raises in
    seconds, rather than wait in gloo's connect for its 10-minute timeout (seen: Ctrl-C 4.5 s
    after the start of a TP=2 engine's process held it there)."""
    import engine.parallel.runner as runner_module
    from tests.processes import exit_at_once, raised_within

    monkeypatch.setattr(runner_module, "worker_main", exit_at_once)
    err = raised_within(60, lambda: LLM(checkpoint("llama"), device="cpu", dtype="float32", tensor_parallel_size=2))
    assert isinstance(err, RankFailedError) and "rank 1 exited before it joined the process group" in str(err)


@pytest.mark.slow  # 2 worker processes
def test_a_step_interrupted_mid_collective_stops_the_engine(checkpoint):
    """Ctrl-C caught in a REPL while rank 1 waits in layer 1's all-reduce: the next call says
    the engine stopped (rather than pairing new collectives with old ones, a hang), and
    the worker is terminated, not left waiting."""
    llm = LLM(checkpoint("llama"), device="cpu", dtype="float32", block_size=4, tensor_parallel_size=2)
    worker = llm.engine.runner.procs[0]
    layer = llm.engine.runner.model.model.layers[1]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    layer.forward = interrupted
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS[1], GREEDY)
    del layer.forward
    with pytest.raises(RankFailedError, match="interrupted half way"):
        llm.generate(PROMPTS[1], GREEDY)
    worker.join(10)
    assert not worker.is_alive()
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


KILLED = textwrap.dedent("""
    import os, signal, sys, time
    # as a terminal's foreground process has it: a job a shell started in the background
    # (CI under nohup, `cmd &`) inherits SIGINT ignored, and Ctrl-C would do nothing at all
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, {root!r})
    from engine import LLM, SamplingParams
    if __name__ == "__main__":
        llm = LLM({path!r}, device="cpu", dtype="float32", tensor_parallel_size=2)
        print(" ".join(str(p.pid) for p in llm.engine.runner.procs), flush=True)
        if {sig} == signal.SIGKILL:
            sys.stdin.readline()  # the test has seen the worker alive: now die (no race with its check)
            os.kill(os.getpid(), signal.SIGKILL)
        while True:  # serving until interrupted
            llm.generate([1, 2, 3], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
""")


@pytest.mark.slow  # an engine process and its workers
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_a_stopped_engine_process_leaves_no_workers(checkpoint, tmp_path, sig):
    script = tmp_path / "serve.py"
    script.write_text(KILLED.format(root=str(ROOT), path=str(checkpoint("llama")), sig=int(sig)))
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 1 and _alive(pids[0])
        if sig == signal.SIGKILL:
            proc.stdin.write("die\n")
            proc.stdin.flush()
        if sig == signal.SIGINT:
            time.sleep(0.5)
            os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the engine and its workers
        proc.wait(30)
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in pids), "a worker rank outlived the engine's process"
    finally:
        proc.kill()


@pytest.mark.slow  # 2 worker processes
def test_bench_parallel_section(checkpoint):
    """`python -m benchmarks.bench --sections parallel`: TP=2 against TP=1, tokens checked equal,
    and each rank's share of the decode forward spent in collectives."""
    from benchmarks.bench.cli import main

    rows = main(["--quick", "--device", "cpu", "--out", "", "--model", str(checkpoint("llama")),
                 "--sections", "parallel"])
    rates = [r for r in rows if r.unit == "tok/s"]
    shares = [r for r in rows if r.unit == "%"]
    # the rates themselves are timings of 8-token runs on a shared CPU: only their checks are asserted
    assert len(rates) == 2 and all("greedy tokens identical" in r.note for r in rates)
    assert len(shares) == 2 and all(0 < r.value < 100 and "6 all-reduces per step" in r.note for r in shares)
