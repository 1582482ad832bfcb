"""Static batching (EngineConfig(batching="static"), engine/static_batching.py): a batch forms
when the engine is empty, no request joins it, and the next forms when its longest ends."""
from engine import EngineConfig, LLMEngine, SamplingParams, Tracer, EventList
from tests.engine_utils import DEVICE


def run(batching: str, lengths: list[int], late: int | None = None) -> list[list[str]]:
    """Each step's batch (request ids); `late`: one more request added after that many steps."""
    sink = EventList()
    engine = LLMEngine(None, device=DEVICE, config=EngineConfig(batching=batching, max_num_seqs=2),
                       tracer=Tracer(sink), trace_level="basic")
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    for i, p in enumerate(params):
        engine.add_request("Once upon a time", p, request_id=f"r{i}")
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
        if steps == late:
            engine.add_request("Once upon a time", SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
                               request_id="late")
    return [[b["request_id"] for b in e.data["batch"]] for e in sink.of(prefix="schedule.step")]


def test_a_static_batch_takes_no_joins_until_its_longest_request_ends():
    batches = run("static", [2, 8, 3])
    first_r2 = next(i for i, b in enumerate(batches) if "r2" in b)
    last_r1 = max(i for i, b in enumerate(batches) if "r1" in b)
    assert first_r2 == last_r1 + 1  # r0's slot freed after 2 tokens, yet r2 waited for r1 (8 tokens)
    assert any(b == ["r1"] for b in batches)  # r1 ran alone: the idle slot


def test_continuous_batching_fills_the_freed_slot_at_once():
    batches = run("continuous", [2, 8, 3])
    last_r0 = max(i for i, b in enumerate(batches) if "r0" in b)
    assert "r2" in batches[last_r0 + 1]


def test_a_late_request_waits_for_the_running_static_batch_even_with_a_slot_free():
    batches = run("static", [6], late=1)  # one member, one slot free when "late" arrives
    assert max(i for i, b in enumerate(batches) if "r0" in b) < min(i for i, b in enumerate(batches) if "late" in b)
    assert "late" in run("continuous", [6], late=1)[1]
