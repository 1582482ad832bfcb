"""Decode steps over padded static buffers (engine/cuda_graph.py). On the CPU the padded
forward runs eagerly (capture=False) with the Triton kernels under the interpreter: the
same kernels and shapes a CUDA graph records; the capture itself is checked on CUDA only."""
import os
from dataclasses import replace

import pytest
import torch
from torch.overrides import TorchFunctionMode

from engine import LLM, EngineConfig, SamplingParams, forward
from engine.batch import ForwardBatch
from engine.cuda_graph import DecodeGraphs, capture_sizes, graphs_wanted, padded_size
from engine.sequence import Sequence
from engine.trace import EventList
from engine.trace.capture import CaptureSpec, PassCapture

CUDA = torch.cuda.is_available() and os.environ.get("TOKENTRACE_TEST_DEVICE") == "cuda"
DEVICE = "cuda" if CUDA else "cpu"
SIZES = [1, 2, 4, 8]
TOL = dict(atol=1e-5, rtol=1e-5) if not CUDA else dict(atol=1e-4, rtol=1e-4)  # GPU GEMMs pick kernels by M
CPU_ONLY = pytest.mark.skipif(CUDA, reason="a CPU stand-in (the CUDA path is tested for real there)")


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 300, (3 + i % 4,), generator=g).tolist() for i in range(n)]


@pytest.fixture(scope="module")
def llama(checkpoint):
    return LLM(checkpoint("llama"), device=DEVICE, dtype="float32", block_size=4, use_triton=True,
               cuda_graphs=False)


@pytest.fixture(scope="module")
def mixtral(checkpoint):
    return LLM(checkpoint("mixtral"), device=DEVICE, dtype="float32", block_size=4, use_triton=True,
               cuda_graphs=False)


@pytest.fixture
def padded(llama):
    """The llama runner with the padded static path on (eager: no capture on the CPU)."""
    runner = llama.engine.runner
    runner.decode_graphs = DecodeGraphs.for_runner(runner, SIZES, capture=False)
    yield runner.decode_graphs
    runner.decode_graphs = None


# --- sizes and decisions ---------------------------------------------------------------------

def test_capture_sizes():
    assert capture_sizes(16) == [1, 2, 4, 8, 16]
    assert capture_sizes(12) == [1, 2, 4, 8, 12]  # the largest batch itself, between two sizes
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(48) == [1, 2, 4, 8, 16, 32]  # a few sizes by default: start-up stays quick
    assert capture_sizes(48, limit=64) == [1, 2, 4, 8, 16, 32, 48]
    assert capture_sizes(16, (8, 1, 64, 4)) == [1, 4, 8]  # given sizes past max_num_seqs dropped
    with pytest.raises(ValueError):
        capture_sizes(16, (0, 4))
    assert [padded_size(SIZES, n) for n in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, None]


def test_graphs_wanted_by_device_and_kernels():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    auto, on, off = EngineConfig(), EngineConfig(cuda_graphs=True), EngineConfig(cuda_graphs=False)
    assert graphs_wanted(auto, cuda, use_triton=True)
    assert not graphs_wanted(off, cuda, use_triton=True)
    assert not graphs_wanted(auto, cuda, use_triton=False)  # the torch decode path reads lengths on the host
    assert not graphs_wanted(auto, cpu, use_triton=True)
    with pytest.raises(ValueError, match="CUDA device"):
        graphs_wanted(on, cpu, use_triton=True)
    with pytest.raises(ValueError, match="Triton"):
        graphs_wanted(on, cuda, use_triton=False)
    with pytest.raises(ValueError, match="sharded"):
        EngineConfig(cuda_graphs=True, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="cuda_graph_sizes"):
        EngineConfig(cuda_graph_sizes=(0, 4))


@CPU_ONLY
def test_cpu_engine_has_no_graphs(llama, checkpoint):
    assert llama.engine.runner.decode_graphs is None  # cuda_graphs=False
    assert LLM(checkpoint("llama"), device="cpu", num_kv_blocks=8).engine.runner.decode_graphs is None


def _batch(lens: list[int], width: int = 2) -> ForwardBatch:
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    T, B = starts[-1], len(lens)
    return ForwardBatch(input_ids=torch.zeros(T, dtype=torch.long), positions=torch.zeros(T, dtype=torch.long),
                        slot_mapping=torch.zeros(T, dtype=torch.long), query_starts=starts, context_lens=[1] * B,
                        block_tables=torch.zeros(B, width, dtype=torch.long),
                        context_lens_t=torch.ones(B, dtype=torch.int32), use_triton=True)


def test_which_steps_fall_back_to_eager(padded):
    assert padded.eager_reason(_batch([1, 1, 1])) is None
    assert padded.eager_reason(_batch([1] * 8)) is None
    assert "prefill" in padded.eager_reason(_batch([5]))
    assert "prefill" in padded.eager_reason(_batch([1, 3, 1]))  # mixed: a chunk of prefill with decodes
    assert "above the largest" in padded.eager_reason(_batch([1] * 9))
    full = CaptureSpec([0], None, 64, False, 0)
    assert "full trace" in padded.eager_reason(_batch([1, 1]), PassCapture([None, full]))
    lens = PassCapture([None, CaptureSpec([], None, 64, False, 0, logit_lens=5)], lens_rows=[1])
    assert "full trace" in padded.eager_reason(_batch([1, 1]), lens)
    assert "wider" in padded.eager_reason(_batch([1], width=padded.static.block_tables.shape[1] + 1))
    static = padded.batches[4]  # what a graph records: counted, its lengths never read on the host
    assert static.num_seqs == 4 and static.decode_only and static.static_shapes and static.use_triton
    with pytest.raises(RuntimeError, match="on the device only"):
        static.context_lens[0]
    with pytest.raises(RuntimeError, match="on the device only"):
        sum(static.context_lens)


# --- the padded path against the ordinary one ------------------------------------------------

def _decoding(engine, n: int) -> list[Sequence]:
    """n sequences with their prompts in the cache (the quick torch kernels) and a next token
    to decode (forward.run's next pass, or forward.prepare's)."""
    seqs = []
    for i, ids in enumerate(prompts(n, seed=n)):
        seq = forward.admit(engine, ids, f"pad{i}")
        forward.run(engine, [seq], rows=[len(ids) - 1], use_triton=False)
        seq.token_ids.append(7 + i)  # its next token, to be decoded
        seqs.append(seq)
    return seqs


@pytest.mark.parametrize("n", [1, 3, 8, 5], ids=["1", "3-padded-to-4", "8", "5-crosses-4-to-8"])
def test_padded_decode_matches_the_eager_pass(llama, padded, n):
    engine = llama.engine
    runner, bm = engine.runner, engine.block_manager
    seqs = _decoding(engine, n)
    try:
        batch = forward.prepare(engine, seqs)
        real = set(batch.slot_mapping.tolist())
        before = runner.kv_cache.clone()
        got = runner.run(batch)  # padded to padded_size(SIZES, n), static buffers
        assert padded.replays == 1
        # the pool changed at this step's n slots only: padding rows wrote nothing, anywhere
        per_slot = (runner.kv_cache != before).flatten(4).any(-1).any(0).any(0).flatten()
        assert set(per_slot.nonzero().flatten().tolist()) == real
        runner.decode_graphs = None
        want = forward.run(engine, seqs, advance=False)  # the ordinary eager pass, Triton kernels
        ref = forward.run(engine, seqs, advance=False, use_triton=False)  # and the torch kernels
        runner.decode_graphs = padded
    finally:
        for s in seqs:
            bm.free_seq(s)
    assert got.shape == (n, engine.model_config.vocab_size)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(got, ref, **TOL)
    assert got.argmax(-1).tolist() == want.argmax(-1).tolist() == ref.argmax(-1).tolist()


@pytest.mark.slow  # two engines, padded and eager, token for token
def test_engine_greedy_tokens_and_kv_pages_with_padded_steps(llama, padded):
    """Five requests of different lengths: prefill and mixed steps run eagerly, the decode
    steps (5, padded to 8, then fewer as requests finish) through the static buffers; the
    tokens equal the ordinary engine's and every KV page comes back."""
    engine = llama.engine
    params = [SamplingParams(temperature=0, max_tokens=3 + i, ignore_eos=True) for i in range(5)]
    ps = prompts(5, seed=11)
    engine.block_manager.cached.clear()
    got = [o.token_ids for o in llama.generate(ps, params)]
    assert padded.replays >= 4
    llama.engine.runner.decode_graphs = None
    engine.block_manager.cached.clear()
    want = [o.token_ids for o in llama.generate(ps, params)]
    assert got == want
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_full_trace_steps_run_eagerly_and_basic_ones_replay(llama, padded):
    engine = llama.engine
    events = EventList()
    llama.tracer.add_sink(events)
    try:
        for level in ("basic", "full"):
            before = padded.replays
            rid = engine.add_request(prompts(1, seed=3)[0], SamplingParams(temperature=0, max_tokens=4),
                                     trace_level=level)
            while engine.has_unfinished_requests():
                engine.step()
            engine.release(rid)
            # 3 decode steps after the prefill: replayed when basic, eager when full
            assert padded.replays - before == (3 if level == "basic" else 0), level
            assert [e.type for e in events.of(rid, "token")].count("token") == 4
            steps = [e for e in events.of(None, "schedule.step") if e.data["batch"][0]["request_id"] == rid]
            assert len(steps) == 4 and all(e.data["forward_seconds"] > 0 for e in steps)
            assert bool(events.of(rid, "attention")) == (level == "full")
    finally:
        llama.tracer.remove_sink(events)


# --- nothing read on the host inside the padded pass -------------------------------------------

# a value read into Python, or a tensor made from Python values (a host-to-device copy that a
# graph would replay with the values of the capture)
_HOST_READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "numpy", "cpu",
               "bincount", "unique", "tensor", "as_tensor"}


class NoHostReads(TorchFunctionMode):
    """Fails on a tensor value read into Python (a device sync, and a value a CUDA graph would
    freeze at capture) or a tensor built from Python values. Paused inside the Triton launches: on the CPU the interpreter reads
    its arguments on the host, which compiled kernels never do."""
    paused = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not self.paused and getattr(func, "__name__", None) in _HOST_READS:
            raise AssertionError(f"host read in the decode pass: {func.__name__}")
        return func(*args, **(kwargs or {}))


@pytest.fixture
def no_host_reads(monkeypatch):
    import engine.kernels as kernels
    mode = NoHostReads()
    for name in ("paged_decode_attention", "store_kv"):
        fn = getattr(kernels, name)

        def paused(*a, _fn=fn, **kw):
            mode.paused = True
            try:
                return _fn(*a, **kw)
            finally:
                mode.paused = False
        monkeypatch.setattr(kernels, name, paused)
    return mode


@pytest.mark.parametrize("model", ["llama", "mixtral"])
@pytest.mark.parametrize("n", [1, 3])
def test_padded_pass_reads_nothing_on_the_host(request, no_host_reads, model, n):
    """What a graph records: the pass from the static buffers to the hidden states. The MoE
    model too: a static batch routes by weights on the device, never by expert ids read back
    (the eager batch-1 path reads them, so the guard is shown to catch that)."""
    engine = request.getfixturevalue(model).engine
    runner = engine.runner
    graphs = DecodeGraphs.for_runner(runner, SIZES, capture=False)
    seqs = _decoding(engine, n)
    try:
        batch = forward.prepare(engine, seqs)
        with torch.inference_mode():
            with no_host_reads:
                hidden = graphs.forward(batch)
            assert hidden.shape == (n, engine.model_config.hidden_size)
            if model == "mixtral" and n == 1:  # PyTorch's eager experts (the CPU's C ones read nothing back)
                moes = [layer.mlp for layer in runner.model.model.layers if hasattr(layer.mlp, "c_experts")]
                for m in moes:
                    m.pack(on=False)
                try:
                    with pytest.raises(AssertionError, match="tolist"), no_host_reads:
                        runner.model(batch)
                finally:
                    for m in moes:
                        m.pack()
    finally:
        for s in seqs:
            engine.block_manager.free_seq(s)


# --- the real capture (a CUDA machine: TOKENTRACE_TEST_DEVICE=cuda) -----------------------------

@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (TOKENTRACE_TEST_DEVICE=cuda)")
@pytest.mark.parametrize("arch", ["llama", "mixtral"])
def test_captured_graphs_match_eager(checkpoint, arch):
    path = checkpoint(arch)
    graphed = LLM(path, device="cuda", dtype="float32", block_size=4, max_num_seqs=8)
    eager = LLM(path, device="cuda", dtype="float32", block_size=4, max_num_seqs=8, cuda_graphs=False)
    graphs = graphed.engine.runner.decode_graphs
    assert graphs is not None and sorted(graphs.graphs) == [1, 2, 4, 8]
    assert eager.engine.runner.decode_graphs is None
    params = [SamplingParams(temperature=0, max_tokens=3 + i, ignore_eos=True) for i in range(5)]
    ps = prompts(5, seed=11)
    got = [o.token_ids for o in graphed.generate(ps, params)]
    assert graphs.replays >= 4
    assert got == [o.token_ids for o in eager.generate(ps, params)]
    bm = graphed.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    # one decode step both ways on the graphed runner: the replay against its eager pass
    engine, runner = graphed.engine, graphed.engine.runner
    seqs = _decoding(engine, 3)
    try:
        replayed = forward.run(engine, seqs, advance=False)
        runner.decode_graphs = None
        direct = forward.run(engine, seqs, advance=False)
        runner.decode_graphs = graphs
    finally:
        for s in seqs:
            bm.free_seq(s)
    torch.testing.assert_close(replayed, direct, atol=1e-4, rtol=1e-4)


# --- benchmarks.bench --device cuda: the bandwidth rows --------------------------------------------

@CPU_ONLY
def test_bench_cuda_rows_computed_on_the_cpu(checkpoint, monkeypatch):
    """The bandwidth section's CUDA rows (HBM roofline at batch 1 with and without graphs, and
    graphs against eager), computed on the CPU: the 'graphs' engine runs the padded path
    eagerly, and the copy bandwidth is a stand-in. Nothing here is a speed claim."""
    from benchmarks.bench import bandwidth
    from benchmarks.bench.context import QUICK, Bench
    from engine.llm_engine import LLMEngine

    path = checkpoint("llama")
    b = Bench(path, None, "cpu", QUICK)

    def engine(cuda_graphs=None, **config):
        e = LLMEngine(path, device="cpu", config=EngineConfig(use_triton=True, **config))
        if cuda_graphs:
            e.runner.decode_graphs = DecodeGraphs.for_runner(e.runner, [1, 2], capture=False)
        return e
    monkeypatch.setattr(b, "engine", engine)
    monkeypatch.setattr(bandwidth, "measured_bandwidth", lambda device, nbytes, threads=None: 3e12)
    b.device = "cuda"
    bandwidth.bandwidth_bound(b)
    graphed, eager, speed = b.rows
    assert graphed.name == "batch-1 decode, CUDA graphs: weights + KV read, GB/s"
    assert eager.name == "batch-1 decode, eager: weights + KV read, GB/s"
    assert graphed.baseline == eager.baseline == 3000 and "measured copy (HBM)" in graphed.note
    e = engine()
    read = bandwidth.decode_bytes_per_token(e.runner.model, e.model_config, QUICK.prompt_tokens + QUICK.new_tokens // 2)
    assert speed.name == "batch-1 decode tok/s, CUDA graphs vs eager" and speed.unit == "tok/s"
    assert speed.value == pytest.approx(graphed.value * 1e9 / read) and speed.baseline == pytest.approx(
        eager.value * 1e9 / read)
    replayed = int(speed.note.split(" steps replayed")[0].rsplit(", ", 1)[1])
    assert replayed >= QUICK.new_tokens - 1  # the graphs engine's decode steps took the padded path


def test_cli_flag_turns_graphs_off():
    from app.__main__ import build_service, memory_line, parse_args
    assert not parse_args([]).no_cuda_graphs
    service = build_service(parse_args(["--device", "cpu", "--no-cuda-graphs", "--draft", "none"]))
    assert service.engine.config.cuda_graphs is False and service.engine.runner.decode_graphs is None
    assert "CUDA graphs" not in memory_line(service)
    info = replace(service.engine.describe(), cuda_graphs=[1, 2, 4])  # what a CUDA start-up describes
    service.engine.describe = lambda: info
    assert memory_line(service).endswith("; decode steps replayed from CUDA graphs (batch sizes 1, 2, 4)")


@CPU_ONLY
def test_capture_control_flow_with_a_stand_in_graph(llama, monkeypatch):
    """capture_all and the replay dispatch on the CPU, torch.cuda's graph API replaced by a
    stand-in whose replay reruns the pass it recorded: sizes captured largest first, one memory
    pool shared, progress reported per size, and a step of n replays the graph of its padded
    size and gives the ordinary pass's logits."""
    runner = llama.engine.runner
    graphs = DecodeGraphs.for_runner(runner, SIZES, capture=False)
    graphs.capture = True
    recorded, capturing = [], []

    class StandIn:
        def __init__(self):
            self.size, self.replayed = None, 0

        def pool(self):
            return ("pool of", self)

        def replay(self):
            self.replayed += 1
            padded_forward(self.size)

    class Capture:
        def __init__(self, graph, pool=None):
            self.graph = graph
            recorded.append((graph, pool))

        def __enter__(self):
            capturing.append(self.graph)

        def __exit__(self, *exc):
            capturing.pop()

    padded_forward = graphs._forward

    def record(size):
        if capturing:
            capturing[-1].size = size
        padded_forward(size)
    monkeypatch.setattr(graphs, "_forward", record)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", StandIn)
    monkeypatch.setattr(torch.cuda, "graph", Capture)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    progress = []
    graphs.capture_all(lambda done, total, what: progress.append((done, total, what)))
    assert [g.size for g, _ in recorded] == [8, 4, 2, 1]
    first = recorded[0][0]
    assert recorded[0][1] is None and all(pool == ("pool of", first) for _, pool in recorded[1:])
    assert progress == [(i, 4, "CUDA graphs") for i in (1, 2, 3, 4)]
    assert sorted(graphs.graphs) == SIZES and all(graphs.graphs[s].size == s for s in SIZES)

    engine = llama.engine
    seqs = _decoding(engine, 3)
    try:
        runner.decode_graphs = graphs
        got = forward.run(engine, seqs, advance=False)
        runner.decode_graphs = None
        want = forward.run(engine, seqs, advance=False)
    finally:
        runner.decode_graphs = None
        for s in seqs:
            engine.block_manager.free_seq(s)
    assert [graphs.graphs[s].replayed for s in SIZES] == [0, 0, 1, 0]  # 3 sequences: the graph of 4
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("arch", ["mistral", "gemma3", "qwen2_moe"])
def test_padded_decode_in_other_families(checkpoint, arch):
    """Sliding windows (Mistral; Gemma 3's local layers with their own RoPE) and a MoE with a
    shared expert: 3 sequences padded to 4 give the eager pass's logits."""
    llm = LLM(checkpoint(arch), device=DEVICE, dtype="float32", block_size=4, use_triton=True, cuda_graphs=False)
    engine, runner = llm.engine, llm.engine.runner
    seqs = _decoding(engine, 3)
    for _ in range(6):  # past Mistral's window of 8 and Gemma's of 6
        forward.run(engine, seqs, use_triton=False)  # only fills the cache: the quick kernels
        for s in seqs:
            s.token_ids.append(9)
    want = forward.run(engine, seqs, advance=False)
    runner.decode_graphs = DecodeGraphs.for_runner(runner, SIZES, capture=False)
    got = forward.run(engine, seqs, advance=False)
    assert runner.decode_graphs.replays == 1
    assert min(s.num_computed_tokens for s in seqs) + 1 > 8
    torch.testing.assert_close(got, want, **TOL)
