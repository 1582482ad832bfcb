"""Prefill and decode apart (engine/disagg) against one colocated engine with chunked prefill.

    python -m benchmarks.disagg [--model M] [--streams 4] [--long 3] [--long-tokens 384]
                                [--prefill-ranks 1] [--decode-ranks 1] [--json OUT]

One mixed workload: decode streams running, then long prompts arriving while they decode.
Colocated, the long prompts' chunks share the streams' steps (chunked prefill keeps each
step under max_num_batched_tokens, so every chunk delays every stream's next token);
disaggregated, they are prefilled on the prefill engine and only their KV pages reach the
decode engine. Reported: the long prompts' TTFT and the handover's share of it, the decode
streams' inter-token gaps (p50, p99), and throughput; greedy tokens checked equal.

On a 2-core CPU the comparison is about hardware as much as design: the colocated engine
runs on one core; the disaggregated one runs with both processes pinned to that same core
(the same hardware: they compete for it, as prefill and decode compete inside the colocated
engine) and with a core each (twice the hardware). The measured trade-off is the CPU's, not
a GPU cluster's. For that, the second table computes, for reference models, the KV bytes a
token hands over and the link speed at which the handover stays under a tenth of the
prefill.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass

import torch

from engine import DisaggEngine, EngineConfig, EventList, LLMEngine, SamplingParams, Tracer
from visualizers.kv_calculator import DTYPE_BYTES, REFERENCE_MODELS

# --- the reference: bytes per token against prefill compute ---------------------------------
# Active parameters per token (DeepSeek-V3: 37B of 671B are active), prefill FLOPs ~ 2 x that
# per token (attention's quadratic part left out: it only makes prefill longer, the handover cheaper).
ACTIVE_PARAMS = {"Llama-3-8B": 8.0e9, "Llama-3-70B": 70.6e9, "DeepSeek-V3": 37e9}
GPU_FLOPS = 989e12  # H100 SXM, bf16 dense
MFU = 0.4  # a prefill's share of that peak (long prompts run compute-bound)
LINKS = {"NVLink 4 (450 GB/s a way)": 450e9, "400 Gb/s RDMA": 400e9 / 8, "100 Gb/s Ethernet": 100e9 / 8}
BUDGET = 0.1  # the handover may take a tenth of the prefill's time


def kv_bytes_per_token(name: str, dtype: str = "bfloat16") -> float:
    return REFERENCE_MODELS[name].values_per_token * DTYPE_BYTES[dtype]


def handover_share(name: str, link_bytes_per_s: float, dtype: str = "bfloat16") -> float:
    """The handover's time over the prefill's, per GPU (each GPU sends its own shard of the
    pages on its own link, so tensor parallelism divides both alike), for any prompt length."""
    prefill_s_per_token = 2 * ACTIVE_PARAMS[name] / (GPU_FLOPS * MFU)
    return kv_bytes_per_token(name, dtype) / link_bytes_per_s / prefill_s_per_token


def min_link_gbit(name: str, dtype: str = "bfloat16") -> float:
    """The slowest link (Gbit/s) at which the handover stays under BUDGET of the prefill."""
    prefill_s_per_token = 2 * ACTIVE_PARAMS[name] / (GPU_FLOPS * MFU)
    return kv_bytes_per_token(name, dtype) / (BUDGET * prefill_s_per_token) * 8 / 1e9


def reference_table() -> list[dict]:
    return [{"model": name, "kv_bytes_per_token": kv_bytes_per_token(name),
             "min_link_gbit_s": min_link_gbit(name),
             "share_of_prefill": {link: handover_share(name, bw) for link, bw in LINKS.items()}}
            for name in ACTIVE_PARAMS]


# --- the measured workload ------------------------------------------------------------------
@dataclass
class Workload:
    streams: int = 4
    stream_tokens: int = 48
    long: int = 3
    long_tokens: int = 384
    long_max_tokens: int = 4
    every_s: float = 0.3  # a long prompt arrives this often once the streams decode
    chunk: int = 64  # max_num_batched_tokens: the chunked prefill's budget per step


def prompts(w: Workload, round_: int) -> tuple[list[list[int]], list[list[int]]]:
    """Fresh prompts each round: a prompt seen before would come from the prefix cache."""
    g = torch.Generator().manual_seed(29 + round_)
    short = [torch.randint(4, 250, (12,), generator=g).tolist() for _ in range(w.streams)]
    long = [torch.randint(4, 250, (w.long_tokens,), generator=g).tolist() for _ in range(w.long)]
    return short, long


def drive(engine: LLMEngine, w: Workload, round_: int) -> dict:
    """The streams first (until each has its first token), then a long prompt every every_s."""
    short, long = prompts(w, round_)
    sp = SamplingParams(temperature=0, max_tokens=w.stream_tokens, ignore_eos=True)
    lp = SamplingParams(temperature=0, max_tokens=w.long_max_tokens, ignore_eos=True)
    streams = [engine.add_request(p, sp) for p in short]
    while not all(engine.requests[r].num_output_tokens for r in streams):
        engine.step()
    t0 = time.perf_counter()
    arrivals = [t0 + i * w.every_s for i in range(w.long)]
    longs: list[str] = []
    tokens = 0
    while engine.has_unfinished_requests() or len(longs) < w.long:
        while len(longs) < w.long and time.perf_counter() >= arrivals[len(longs)]:
            # traced at level basic (disaggregated: its kv.transfer splits the handover into wait and wire)
            longs.append(engine.add_request(long[len(longs)], lp, trace_level="basic"))
        tokens += sum(1 for o in engine.step() if o.token_id >= 0)
    wall = time.perf_counter() - t0
    gaps = [b - a for r in streams for a, b in zip(engine.requests[r].token_times, engine.requests[r].token_times[1:])
            if a >= t0]
    metrics = [engine.get_output(r).metrics for r in longs]
    ttft = [m["ttft"] for m in metrics]
    transfer = [m["ttft_split"].get("kv_transfer", 0.0) for m in metrics]
    wire = [e.data["wire_ms"] for e in getattr(engine, "sink", EventList()).events
            if e.type == "kv.transfer" and e.request_id in longs]
    out = {"ttft_ms": [t * 1e3 for t in ttft], "transfer_ms": [t * 1e3 for t in transfer], "wire_ms": wire,
           "transfer_share_of_ttft": sum(transfer) / sum(ttft),
           "gap_p50_ms": _pct(gaps, 50) * 1e3, "gap_p99_ms": _pct(gaps, 99) * 1e3,
           "tokens_per_s": tokens / wall, "wall_s": wall,
           "tokens": [engine.get_output(r).token_ids for r in streams + longs], "prompts": round_}
    for r in streams + longs:
        engine.release(r)
    return out


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))] if xs else float("nan")


KINDS = ("colocated, 1 core", "disaggregated, both on that core", "disaggregated, 1 core each")


def measure(model: str | None, w: Workload, rounds: int = 1, prefill_ranks: int = 1, decode_ranks: int = 1) -> dict:
    """Colocated on one core; disaggregated with every process pinned to that same core (the
    same hardware: they compete for it), and with the prefill processes on another core (twice
    the hardware). One thread everywhere; interleaved `rounds` times (the machine's load
    drifts), after one warm-up round each. Linux (sched_setaffinity). prefill_ranks /
    decode_ranks: the disaggregated layout (default one engine a side)."""
    cores = sorted(os.sched_getaffinity(0))
    config = EngineConfig(max_num_batched_tokens=w.chunk, max_num_seqs=w.streams + w.long)
    one = LLMEngine(model, device="cpu", config=config, tracer=None)
    sink = EventList()
    two = DisaggEngine(model, device="cpu", config=config, tracer=Tracer(sink), trace_level="off",
                       prefill_ranks=prefill_ranks, decode_ranks=decode_ranks)
    two.sink = sink  # the long prompts' kv.transfer events (drive() reads them)
    first, second = cores[0], cores[-1]
    pins = {KINDS[0]: (first, None), KINDS[1]: (first, first), KINDS[2]: (first, second)}
    kinds = KINDS if len(cores) > 1 else KINDS[:2]
    torch.set_num_threads(1)
    try:
        runs: dict[str, list[dict]] = {k: [] for k in kinds}
        for i in range(-1, rounds):  # round -1: the warm-up, not kept
            for k in kinds:
                here, there = pins[k]
                os.sched_setaffinity(0, {here})
                if there is not None:
                    for proc in two.procs:  # every prefill engine's process
                        os.sched_setaffinity(proc.pid, {there})
                r = drive(one if k == KINDS[0] else two, w, i * len(KINDS) + KINDS.index(k))
                if i >= 0:
                    runs[k].append(r)
        same = _same_tokens(one, w, runs)  # untimed, after the measured rounds
    finally:
        os.sched_setaffinity(0, set(cores))
        two.shutdown()
    summary = {k: _median_run(v) for k, v in runs.items()}
    return {"workload": w.__dict__, "cores": len(cores), "tokens_equal": same, "rounds": rounds,
            "layout": {"prefill_ranks": prefill_ranks, "decode_ranks": decode_ranks}, **summary}


def _same_tokens(one: LLMEngine, w: Workload, runs: dict) -> bool:
    """Greedy tokens of every disaggregated run equal the colocated engine's on the same prompts
    (prompts it never saw: none comes from its prefix cache either)."""
    for k in KINDS[1:]:
        for r in runs.get(k, []):
            short, long = prompts(w, r["prompts"])
            sp = SamplingParams(temperature=0, max_tokens=w.stream_tokens, ignore_eos=True)
            lp = SamplingParams(temperature=0, max_tokens=w.long_max_tokens, ignore_eos=True)
            ids = [one.add_request(p, sp) for p in short] + [one.add_request(p, lp) for p in long]
            while one.has_unfinished_requests():
                one.step()
            if [one.get_output(i).token_ids for i in ids] != r["tokens"]:
                return False
            for i in ids:
                one.release(i)
    return True


def _median_run(runs: list[dict]) -> dict:
    med = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
    return {"ttft_ms_median": statistics.median(t for r in runs for t in r["ttft_ms"]),
            "transfer_ms_median": statistics.median(t for r in runs for t in r["transfer_ms"]),
            "wire_ms_median": statistics.median([t for r in runs for t in r["wire_ms"]] or [0.0]),
            "transfer_share_of_ttft": med("transfer_share_of_ttft"), "gap_p50_ms": med("gap_p50_ms"),
            "gap_p99_ms": med("gap_p99_ms"), "tokens_per_s": med("tokens_per_s")}


def report(result: dict) -> str:
    lines = [f"mixed workload: {result['workload']['streams']} decode streams, {result['workload']['long']} prompts "
             f"of {result['workload']['long_tokens']} tokens arriving every {result['workload']['every_s']} s; "
             f"chunked prefill {result['workload']['chunk']} tokens a step; disaggregated "
             f"{_layout(result)}; one thread a process, pinned "
             f"({result['cores']} CPU cores, shared with whatever else runs); {result['rounds']} round(s) after a "
             f"warm-up, interleaved",
             f"{'':34}{'TTFT ms':>10}{'handover ms':>13}{'wire ms':>9}{'share':>8}{'gap p50':>9}{'gap p99':>9}{'tok/s':>8}"]
    for k in [k for k in KINDS if k in result]:
        r = result[k]
        lines.append(f"{k:34}{r['ttft_ms_median']:>10.1f}{r['transfer_ms_median']:>13.2f}{r['wire_ms_median']:>9.2f}"
                     f"{r['transfer_share_of_ttft']:>8.1%}{r['gap_p50_ms']:>9.1f}{r['gap_p99_ms']:>9.1f}"
                     f"{r['tokens_per_s']:>8.1f}")
    lines.append(f"greedy tokens equal (disaggregated and colocated, same prompts): {result['tokens_equal']}")
    lines.append("")
    lines.append(f"reference (bf16 KV, H100 at {MFU:.0%} of {GPU_FLOPS / 1e12:.0f} TFLOP/s for the prefill): "
                 f"the handover's time as a share of the prefill's")
    lines.append(f"{'model':14}{'KV B/token':>12}{'needs Gb/s':>12}" + "".join(f"{k:>26}" for k in LINKS))
    for r in result.get("reference", reference_table()):
        lines.append(f"{r['model']:14}{r['kv_bytes_per_token']:>12,.0f}{r['min_link_gbit_s']:>12,.0f}"
                     + "".join(f"{r['share_of_prefill'][k]:>25.1%}" + ("✓" if r["share_of_prefill"][k] < BUDGET else "✗")
                               for k in LINKS))
    return "\n".join(lines)


def _layout(result: dict) -> str:
    lay = result.get("layout") or {"prefill_ranks": 1, "decode_ranks": 1}
    return f"{lay['prefill_ranks']} prefill + {lay['decode_ranks']} decode engine(s)"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.disagg", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="checkpoint (default: the embedded model)")
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--long", type=int, default=3)
    p.add_argument("--long-tokens", type=int, default=384)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--prefill-ranks", type=int, default=1, help="prefill engines (processes) of the disaggregated run")
    p.add_argument("--decode-ranks", type=int, default=1, help="decode engines (in the serving process)")
    p.add_argument("--reference-only", action="store_true", help="only the computed table (no engine runs)")
    p.add_argument("--json", default=None, metavar="OUT")
    a = p.parse_args(argv)
    if a.reference_only:
        result = {"reference": reference_table()}
        print(report({**_empty_result(), **result}).split("\n\n", 1)[1])
    else:
        result = measure(a.model, Workload(streams=a.streams, long=a.long, long_tokens=a.long_tokens), a.rounds,
                         a.prefill_ranks, a.decode_ranks)
        result["reference"] = reference_table()
        print(report(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


def _empty_result() -> dict:
    zero = {"ttft_ms_median": 0.0, "transfer_ms_median": 0.0, "wire_ms_median": 0.0, "transfer_share_of_ttft": 0.0, "gap_p50_ms": 0.0,
            "gap_p99_ms": 0.0, "tokens_per_s": 0.0}
    return {"workload": Workload().__dict__, "cores": os.cpu_count(), "rounds": 0, "tokens_equal": True,
            **{k: zero for k in KINDS}}


if __name__ == "__main__":
    main()
