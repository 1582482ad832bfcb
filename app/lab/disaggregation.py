"""Prefill and decode apart: one mixed workload (4 streams decoding, long prompts arriving
while they do), colocated on one engine with chunked prefill against disaggregated
(engine/disagg: a prefill engine in a process of its own, each request's KV pages handed to
the decode engine on torch.distributed). Colocated, every chunk of a long prompt shares a
step with the streams' decodes and delays their next token; disaggregated, no decode step
carries a prefill token, and each request pays a handover instead.

Counted (the same on any machine): the prefill tokens the streams' steps carried, the pages
handed over (blocks x bytes a block), the tokens themselves. Timed (this machine's): TTFT and
the handover's share of it (kv.transfer), the streams' gaps, throughput. The long prompts
arrive once the streams have emitted a fixed number of tokens: the same point of the work in
both settings, whose steps differ."""
from __future__ import annotations

import os
import statistics
from dataclasses import asdict

import torch

from engine import SamplingParams, TokenOutput

from app.lab.experiment import Experiment, Setting, SettingResult
from app.lab.measure import percentile, step_records
from app.lab.runner import Job, Lab
from app.lab.workloads import LONG_TEXT, PROMPTS
from visualizers import lab_disagg

STREAMS = 4
STREAM_TOKENS = {"full": 128, "ci": 32}
LONG = {"full": 3, "ci": 2}
LONG_TOKENS = {"full": 768, "ci": 256}  # each; at most the model's context (less the answer)
CHUNK = {"full": 256, "ci": 64}  # max_num_batched_tokens, both settings (the prefill side chunks too)
FIRST_AFTER = {"full": 8, "ci": 4}  # each stream's tokens before the first long prompt arrives
EVERY = {"full": 32, "ci": 8}  # each stream's tokens between two long prompts
LONG_ANSWER = 4


def settings(size: str) -> list[Setting]:
    common = {"streams": STREAMS, "stream_tokens": STREAM_TOKENS[size], "long_prompts": LONG[size],
              "long_prompt_tokens": LONG_TOKENS[size], "chunk": CHUNK[size],
              "arrive_after_stream_tokens": [STREAMS * (FIRST_AFTER[size] + i * EVERY[size])
                                             for i in range(LONG[size])]}
    return [Setting("colocated", f"colocated, chunks of {CHUNK[size]}", {**common, "disaggregate": False}),
            Setting("disaggregated", "disaggregated (prefill | decode)", {**common, "disaggregate": True})]


def long_prompts(tokenizer, count: int, n: int) -> list[list[int]]:
    """count prompts of n tokens, each starting elsewhere in the long text (no shared prefix)."""
    piece = tokenizer.encode(LONG_TEXT, add_special_tokens=False)
    ids = piece * (n // len(piece) + 2)
    step = max(1, len(piece) // max(1, count))
    return [ids[i * step:i * step + n] for i in range(count)]


def run_setting(lab: Lab, setting: Setting) -> SettingResult:
    o = setting.options
    tokens: dict[str, list[int]] = {}

    def keep(role: str, out: TokenOutput) -> None:
        if out.token_id >= 0:
            tokens.setdefault(out.request_id, []).append(out.token_id)

    # the same options both ways; the prefix cache off so the prompts' work is the same in both.
    # Disaggregated on CUDA takes a GPU a side: with fewer than two, both settings run on the CPU
    device = lab.device if torch.cuda.device_count() >= 2 else "cpu"
    with lab.engine(max_num_batched_tokens=o["chunk"], enable_prefix_caching=False, device=device,
                    disaggregate=o["disaggregate"]) as (engine, events):
        # a DisaggEngine gives each of its processes half the cores' threads; the colocated engine
        # the same (given back after): a step runs on as many threads either way, and the
        # disaggregated engine has a second process of them. (All the threads of a loaded 2-core
        # machine in one engine ran its steps up to 20x slower here: spinning OpenMP threads.)
        if not o["disaggregate"]:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
        threads = torch.get_num_threads()
        info = engine.describe()
        pool = info.kv_pool
        n = min(o["long_prompt_tokens"], engine.max_model_len - LONG_ANSWER - 1)
        stream = SamplingParams(temperature=0, max_tokens=o["stream_tokens"], ignore_eos=True)
        answer = SamplingParams(temperature=0, max_tokens=LONG_ANSWER, ignore_eos=True)
        jobs = [Job("stream", PROMPTS[i], stream) for i in range(o["streams"])]
        jobs += [Job("long prompt", p, answer, after=("stream", after))
                 for p, after in zip(long_prompts(engine.tokenizer, o["long_prompts"], n),
                                     o["arrive_after_stream_tokens"])]
        drive = lab.drive(engine, events, jobs, on_output=keep)
    result = drive.setting_result(setting)
    result.events = [e for e in drive.events if e["type"] == "kv.transfer"]
    prefill_side = step_records(drive.events, drive.t0, engine="prefill")
    result.extra = {"prefill_steps": [asdict(s) for s in prefill_side],
                    "tokens": [tokens.get(r.request_id, []) for r in result.per_request]}
    result.metrics = metrics(result, pool.block_size * pool.bytes_per_token, threads,
                             2 if o["disaggregate"] else 1)
    result.metrics["device"] = info.model.device
    result.metrics["cpu_s"] = None  # this process's CPU time leaves out the prefill engine's process
    return result


def metrics(r: SettingResult, bytes_per_block: int, threads: int, processes: int) -> dict:
    streams = [q for q in r.per_request if q.role == "stream"]
    longs = [q for q in r.per_request if q.role == "long prompt"]
    ids = {q.request_id for q in streams}
    gaps = [g for q in streams for g in q.gaps_s]
    # the steps a stream's next token waited on, and the prefill tokens they carried beside it
    with_streams = [s for s in r.steps if any(b["request_id"] in ids and b["kind"] == "decode" for b in s.batch)]
    carried = [s.prefill_tokens for s in with_streams]
    long_ids = {q.request_id for q in longs}
    moved = [e for e in r.events if e["request_id"] in long_ids]
    ttft = {q.request_id: q.ttft_s for q in longs if q.ttft_s is not None}
    handover = sum(e["handover_ms"] for e in moved) / 1e3
    wire = sum(e["wire_ms"] for e in moved) / 1e3
    total_ttft = sum(ttft[e["request_id"]] for e in moved if e["request_id"] in ttft)
    out_tokens = sum(q.output_tokens for q in r.per_request)
    span = max((q.finish_s or 0) for q in r.per_request) - min(q.arrival_s for q in r.per_request)
    return {"long_prompts": len(longs), "long_prompt_tokens": longs[0].prompt_tokens if longs else 0,
            "long_ttft_median_s": statistics.median(ttft.values()) if ttft else None,
            "long_ttft_max_s": max(ttft.values()) if ttft else None,
            "gap_p50_s": percentile(gaps, 50), "gap_p99_s": percentile(gaps, 99),
            "longest_stall_s": max(gaps) if gaps else None,
            "tokens_per_s": out_tokens / span if span > 0 else None, "output_tokens": out_tokens,
            # counted: the same on any machine
            "stream_steps": len(with_streams), "stream_steps_with_prefill": sum(c > 0 for c in carried),
            "prefill_tokens_beside_streams": sum(carried), "max_prefill_tokens_beside_streams": max(carried, default=0),
            "handovers": len(r.events), "handover_blocks": sum(e["num_blocks"] for e in r.events),
            "handover_bytes": sum(e["bytes"] for e in r.events), "bytes_per_block": bytes_per_block,
            # timed: the long prompts' handovers against their TTFT (kv.transfer: first token drawn -> pages in)
            "handover_share_of_ttft": handover / total_ttft if moved and total_ttft else None,
            "wire_share_of_ttft": wire / total_ttft if moved and total_ttft else None,
            "handover_ms_median": statistics.median(e["handover_ms"] for e in moved) if moved else None,
            "wire_ms_median": statistics.median(e["wire_ms"] for e in moved) if moved else None,
            # first token drawn -> the send began: the decode side's blocks and its PULL, between its steps
            "queue_ms_median": statistics.median(e["queue_ms"] for e in moved) if moved else None,
            "prefill_engine_steps": len(r.extra.get("prefill_steps", [])),
            "processes": processes, "threads_per_process": threads}


def compare(settings: list[SettingResult]) -> None:
    """Whether the disaggregated engine emitted the colocated one's tokens (greedy: it should)."""
    ref = settings[0].extra["tokens"]
    for s in settings:
        s.metrics["same_tokens_as_colocated"] = s.extra["tokens"] == ref


EXPERIMENT = Experiment(
    name="disaggregation", title="Prefill and decode apart: colocated with chunked prefill vs disaggregated",
    what="4 streams decode while long prompts arrive: one engine with chunked prefill against a prefill engine "
         "and a decode engine in two processes, the KV pages handed over; TTFT and the handover's share of it, "
         "the streams' gaps, throughput.",
    settings=settings, run_setting=run_setting, figures=lab_disagg.figures, sentences=lab_disagg.sentences,
    compare=compare,
    repeats={"ci": 3, "full": 3},  # two processes a run: fewer repeats (two copies of one arm part 1 run in 10)
    headline=[("prefill_tokens_beside_streams", "prefill tokens in the streams' steps"),
              ("handover_blocks", "blocks handed over"), ("handover_bytes", "bytes handed over"),
              ("long_ttft_median_s", "long prompts' TTFT, median (s)"),
              ("handover_share_of_ttft", "handover's share of TTFT"),
              ("gap_p50_s", "gap p50 (s)"), ("gap_p99_s", "gap p99 (s)"), ("longest_stall_s", "longest stall (s)"),
              ("tokens_per_s", "tokens/s")])
