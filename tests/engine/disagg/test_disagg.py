"""Disaggregated prefill and decode (engine/disagg) on the CPU: two processes over gloo.

The disaggregated engine must produce what one colocated engine produces: the same greedy
tokens and the same seeded draws (the first token drawn on the prefill side, the
generator's state handed over with the pages), on the embedded model and tiny Llama, Qwen3
and Mixtral checkpoints; its prefix cache works on the prefill side; no block is left
behind on either side after aborts, a disconnect, or a killed prefill process (those three
with two prefill and two decode engines too; tokens of the other layouts: test_disagg_ranks).
"""
from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from engine import LLM, DisaggFailedError, SamplingParams
from tests.paths import ROOT

EMBEDDED = ROOT / "assets" / "models" / "target"
_base = torch.randint(4, 300, (37,), generator=torch.Generator().manual_seed(37)).tolist()
# the third shares its first 5 blocks (block_size 4) with the first: a prefix-cache hit on the prefill side
PROMPTS = [_base, _base[:9], _base[:20] + [7, 8, 9, 10, 11]]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
SEEDED = [SamplingParams(temperature=0.9, top_p=0.9, seed=s, max_tokens=10, ignore_eos=True)
          for s in (3, 4, 5)]


def _pools_empty(llm: LLM) -> None:
    """Every pool holds nothing: every block free in each decode engine's, none held or live in any prefill engine's."""
    e = llm.engine
    for d in e.decode_stats():
        assert d["free_blocks"] == d["num_blocks"] and d["running"] == d["waiting"] == 0
    stats = e.prefill_stats()
    assert stats["free_blocks"] == stats["num_blocks"] and stats["held"] == [] and stats["live"] == []
    assert not e.remote and not e.ready and not e.inflight


def _one(model) -> LLM:
    return LLM(model, device="cpu", dtype="float32", block_size=4)


@pytest.mark.slow  # a prefill process per model
@pytest.mark.parametrize("arch", ["embedded", "llama", "qwen3", "mixtral", "deepseek_v3"])
def test_disaggregated_tokens_equal_one_engine(checkpoint, arch, tmp_path):
    """deepseek_v3: MLA's pool keeps one latent a token a layer; its pages travel the same way."""
    if arch == "deepseek_v3":
        from tests.engine.test_deepseek import make_deepseek
        model = make_deepseek("v3_moe", tmp_path / "v3")
    else:
        model = EMBEDDED if arch == "embedded" else checkpoint(arch)
    one = _one(model)
    want_greedy = [o.token_ids for o in one.generate(PROMPTS, GREEDY)]
    want_seeded = one.generate(PROMPTS, SEEDED)
    with LLM(model, device="cpu", dtype="float32", block_size=4, disaggregate=True) as two:
        assert [o.token_ids for o in two.generate(PROMPTS, GREEDY)] == want_greedy
        seeded = two.generate(PROMPTS, SEEDED)
        assert [o.token_ids for o in seeded] == [o.token_ids for o in want_seeded]
        # the prefill side's prefix cache kept the greedy run's full blocks, as one engine's does
        assert [o.usage.cached_tokens for o in seeded] == [o.usage.cached_tokens for o in want_seeded] == [36, 8, 24]
        for a, b in zip(seeded, want_seeded):
            assert a.metrics["ttft_split"]["kv_transfer"] >= 0
        _pools_empty(two)
    assert not two.engine.proc.is_alive()


def _drain(llm: LLM, limit: int = 500) -> None:
    for _ in range(limit):
        if not llm.engine.has_unfinished_requests():
            return
        llm.engine.step()
    raise AssertionError("the engine did not settle")


def _without_decoding(e, done, timeout_s: float = 120) -> None:
    """Read the prefill side's messages (READY, SENT: a request prefilled, its pages in) with
    no decode step until done()."""
    end = time.monotonic() + timeout_s
    while not done() and time.monotonic() < end:
        e.prefill_stats()
        time.sleep(0.02)


@pytest.mark.slow  # P prefill processes
@pytest.mark.parametrize("ranks", [1, 2], ids=["1P1D", "2P2D"])
def test_aborts_and_a_disconnect_leave_no_block_on_either_side(checkpoint, ranks):
    # 16 blocks of 4 a pool: a 40-token request running leaves too few decode blocks for a 30-token one
    with LLM(checkpoint("llama"), device="cpu", dtype="float32", block_size=4, num_kv_blocks=16,
             disaggregate=True, prefill_ranks=ranks, decode_ranks=ranks) as llm:
        e = llm.engine
        long = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
        with pytest.raises(ValueError, match="n > 1 with disaggregate=True is not built"):
            e.add_request(PROMPTS[1], SamplingParams(n=2))
        # 1. aborted at once: on the prefill side still
        rid = e.add_request(PROMPTS[1], long)
        assert e.abort(rid) and rid not in e.remote
        _drain(llm)
        _pools_empty(llm)
        # 2. a client that disconnects after its first token (the stream closed: LLM.stream aborts)
        stream = llm.stream(PROMPTS[0], long, trace="basic")
        first = next(x for x in stream if type(x).__name__ == "TokenOutput")
        assert first.index == 0
        stream.close()
        _drain(llm)
        _pools_empty(llm)
        # 3. prefilled, waiting for decode blocks (every decode pool is held by a running request), then aborted
        # the filling requests end 20 tokens in: no decode step while another request is on the prefill
        # side or on the wire (another process, slow on a loaded machine), so none ends before b is
        # prefilled (seen in CI); prefill_stats reads the prefill side's messages without a decode step
        fill = []
        for j in range(ranks):  # 10 blocks, one a pool: each decoding before the next is routed (the
            fill.append(e.add_request(_base[:36] + [5, 6, 7, j], long))  # router reads the pools' free blocks)
            _without_decoding(e, lambda: fill[-1] not in e.remote and
                              all(f.seq.request_id != fill[-1] for f in e.inflight.values()))
            for _ in range(300):
                e.step()
                if all(e.requests[a].num_output_tokens > 1 for a in fill):
                    break
        b = e.add_request(_base[:30], long)  # 8 blocks: does not fit beside any of them
        _without_decoding(e, lambda: any(seq.request_id == b for seq, _, _ in e.ready))
        e.step()  # they decode, b waits for its blocks
        if not any(seq.request_id == b for seq, _, _ in e.ready):
            raise AssertionError("b never waited for decode blocks")
        assert e.abort(b)
        e.step()
        assert e.prefill_stats()["held"] == []  # dropped there
        assert [e.abort(a) for a in fill] == [True] * ranks
        _drain(llm)
        _pools_empty(llm)
        # 4. aborted while its pages are on the wire (the receive posted, the send not yet seen)
        c = e.add_request(PROMPTS[0], long)
        for _ in range(300):
            e.step()
            if e.inflight:
                break
        else:
            raise AssertionError("the transfer was never seen in flight")
        assert e.abort(c)
        _drain(llm)
        _pools_empty(llm)
        # and the engine still serves
        assert len(llm.generate(PROMPTS[1], GREEDY)[0].token_ids) == 12
        _pools_empty(llm)


@pytest.mark.slow  # P prefill processes
@pytest.mark.parametrize("ranks", [1, 2], ids=["1P1D", "2P2D"])
def test_a_killed_prefill_process_stops_the_engine_with_one_error(checkpoint, ranks):
    llm = LLM(checkpoint("llama"), device="cpu", dtype="float32", block_size=4, disaggregate=True,
              prefill_ranks=ranks, decode_ranks=ranks)
    e = llm.engine
    assert len(llm.generate(PROMPTS[1], GREEDY)[0].token_ids) == 12
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)  # none ends before the kill is seen
    running = e.add_request(PROMPTS[0], long)
    while not e.requests[running].num_output_tokens:  # decoding here
        e.step()
    # and two sent to the prefill side (two engines: one each, the first where its prefix is cached)
    waiting = [e.add_request(PROMPTS[2], long), e.add_request(list(range(300, 309)), long)]
    os.kill(e.procs[-1].pid, signal.SIGKILL)  # the last prefill engine
    e.procs[-1].join(10)  # dead before the next step: on busy cores the running one could end first
    t = time.monotonic()
    with pytest.raises(DisaggFailedError, match=rf"prefill engine {ranks - 1}'s process \(rank {ranks}\) died "
                                                r"\(exit code -9\)"):
        for _ in range(1000):
            e.step()
    assert time.monotonic() - t < 30
    assert [e.requests[r].finish_reason for r in [running] + waiting] == ["abort"] * 3
    assert all(d["free_blocks"] == d["num_blocks"] for d in e.decode_stats())  # no page leaked here
    assert not any(p.is_alive() for p in e.procs) and not e.has_unfinished_requests()  # the others stopped too
    with pytest.raises(DisaggFailedError, match="died"):  # and stays stopped, saying why
        llm.generate(PROMPTS[1], GREEDY)
    llm.shutdown()


def test_refusals_are_clear_and_start_nothing(checkpoint):
    import multiprocessing as mp

    with pytest.raises(ValueError, match=r"--prefill-ranks 0 --decode-ranks 1: each side takes 1 to 8 engines"):
        LLM(checkpoint("llama"), device="cpu", disaggregate=True, prefill_ranks=0)
    with pytest.raises(ValueError, match=r"--prefill-ranks 1 --decode-ranks 9: each side takes 1 to 8 engines"):
        LLM(checkpoint("llama"), device="cpu", disaggregate=True, decode_ranks=9)
    with pytest.raises(ValueError, match="cuda_graphs=True with more than one decode engine"):
        LLM(checkpoint("llama"), device="cpu", disaggregate=True, decode_ranks=2, cuda_graphs=True)
    with pytest.raises(ValueError, match="speculative decoding"):
        LLM(checkpoint("llama"), device="cpu", disaggregate=True, draft="ngram")
    with pytest.raises(ValueError, match="tensor or expert parallelism"):
        LLM(checkpoint("llama"), device="cpu", disaggregate=True, tensor_parallel_size=2)
    assert not mp.active_children()


def test_the_server_flags_refuse_what_is_not_built():
    from app.__main__ import main

    with pytest.raises(SystemExit, match="--prefill-ranks and --decode-ranks go with --disaggregate"):
        main(["--prefill-ranks", "2"])
    with pytest.raises(SystemExit, match=r"cannot start: --prefill-ranks 1 --decode-ranks 0: each side takes 1 to 8"):
        main(["--disaggregate", "--decode-ranks", "0"])


KILLED = """
import os, signal, sys
# as a terminal's foreground process has it: a job a shell started in the background
# (CI under nohup, `cmd &`) inherits SIGINT ignored, and Ctrl-C would do nothing at all
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {root!r})
from engine import LLM, SamplingParams
if __name__ == "__main__":
    llm = LLM({path!r}, device="cpu", dtype="float32", disaggregate=True, prefill_ranks={ranks})
    print(" ".join(str(p.pid) for p in llm.engine.procs), flush=True)
    if {sig} == signal.SIGKILL:
        llm.generate([1, 2, 3], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # serving until interrupted
        llm.generate([1, 2, 3], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
"""


@pytest.mark.slow  # a serving process and its prefill processes
# (a kill -9 with one prefill process was a case of its own: the same watch of the parent as
# each of the two here, another ~17 s start-up on 2 cores)
@pytest.mark.parametrize("sig,ranks", [(signal.SIGINT, 1), (signal.SIGKILL, 2)], ids=["ctrl-c", "kill-9-2P"])
def test_a_stopped_serving_process_leaves_no_prefill_process(checkpoint, tmp_path, sig, ranks):
    import subprocess
    import sys

    from tests.engine.parallel.test_parallel import _alive

    script = tmp_path / "serve.py"
    script.write_text(KILLED.format(root=str(ROOT), path=str(checkpoint("llama")), sig=int(sig), ranks=ranks))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, start_new_session=True)
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) == ranks
        if sig == signal.SIGINT:
            time.sleep(0.5)
            os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the serving process and the prefill ones
        proc.wait(120)
        deadline = time.monotonic() + 15
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(pid) for pid in pids), "a prefill process outlived the serving process"
    finally:
        proc.kill()


@pytest.mark.slow  # a prefill process
def test_a_prefill_process_gone_before_it_joins_the_group_stops_the_start_up_at_once(checkpoint, monkeypatch):
    """A prefill process that answered the start-up, then ended before it joined the process
    group (a crash): the start-up raises in seconds, rather than wait in gloo's connect for
    its 10-minute timeout."""
    import engine.disagg.engine as engine_module
    from tests.processes import exit_at_once, raised_within, started_then_gone

    monkeypatch.setattr(engine_module, "prefill_main", started_then_gone)
    err = raised_within(60, lambda: LLM(checkpoint("llama"), device="cpu", dtype="float32", disaggregate=True))
    assert isinstance(err, DisaggFailedError) and "exited before it joined the process group" in str(err)
    # one that ends without a word while loading: the same clear error (its closed pipe was an EOFError)
    monkeypatch.setattr(engine_module, "prefill_main", exit_at_once)
    err = raised_within(60, lambda: LLM(checkpoint("llama"), device="cpu", dtype="float32", disaggregate=True))
    assert isinstance(err, DisaggFailedError) and "process exited while loading (exit code 1)" in str(err), err


@pytest.mark.slow  # a prefill process
def test_every_sampling_knob_continues_on_the_decode_side():
    """What the first token's draw on the prefill side must hand over: a stop string's text,
    penalties and biases, a grammar's state, prompt logprobs, a first token that ends it."""
    from engine import TokenOutput
    from engine.structured import Constraint

    prompts = ["Once upon a time there was", "The capital of France is", "List three colors:"]
    params = [SamplingParams(temperature=0, max_tokens=16, stop=[" the"]),
              SamplingParams(temperature=0.8, seed=11, max_tokens=16, presence_penalty=0.8, logit_bias={264: 3.0}),
              SamplingParams(temperature=0, max_tokens=24, structured=Constraint("choice", '["red", "green", "blue"]')),
              SamplingParams(temperature=0, max_tokens=1)]
    one = LLM(EMBEDDED, device="cpu")
    with LLM(EMBEDDED, device="cpu", disaggregate=True) as two:
        for p in params:
            want = [(o.token_ids, o.text, o.finish_reason) for o in one.generate(prompts, p)]
            assert [(o.token_ids, o.text, o.finish_reason) for o in two.generate(prompts, p)] == want
        lp = SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=1, logprobs=1)
        a, b = ([x for x in llm.stream(prompts[0], lp, trace="off") if isinstance(x, TokenOutput)] for llm in (one, two))
        assert [x.token_id for x in a] == [x.token_id for x in b]
        assert [x.logprobs.logprob for x in b] == pytest.approx([x.logprobs.logprob for x in a], abs=1e-5)
        assert [p and p.logprob for p in b[0].prompt_logprobs] == \
            pytest.approx([p and p.logprob for p in a[0].prompt_logprobs], abs=1e-5)
        _pools_empty(two)


@pytest.mark.slow  # a prefill process
def test_a_request_waits_for_held_blocks_rather_than_end_as_too_big(checkpoint):
    """The decode pool is full, so prefilled requests hold their blocks on the prefill side; a
    new request that does not fit beside them waits for the pull (it is not 'too big')."""
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(4, 300, (n,), generator=g).tolist() for n in (40, 30, 36)]
    p = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    want = [o.token_ids for o in _one(checkpoint("llama")).generate(prompts, p)]
    with LLM(checkpoint("llama"), device="cpu", dtype="float32", block_size=4, num_kv_blocks=16,
             disaggregate=True) as llm:
        outs = llm.generate(prompts, p)
        assert [o.finish_reason for o in outs] == ["length"] * 3
        assert [o.token_ids for o in outs] == want
        _pools_empty(llm)
