"""KV capacity: the same 4 requests with a pool that holds them all and with one too small
for their peak. When the small pool runs dry the scheduler preempts the most recently
admitted request: its pages are freed and, readmitted, it recomputes its prompt and the
tokens it had made. Which request lost its pages, at which step, and what it cost (tokens
recomputed, steps, latency) are read from the trace."""
from __future__ import annotations

import math

from engine import SamplingParams

from app.lab.experiment import Experiment, Setting, SettingResult
from app.lab.measure import mean
from app.lab.runner import Job, Lab
from app.lab.workloads import LONG_TEXT
from visualizers import lab_kv

REQUESTS = 4
BLOCK = 16
PROMPT_TOKENS = {"full": 64, "ci": 32}
OUTPUT_TOKENS = {"full": 128, "ci": 48}


def settings(size: str) -> list[Setting]:
    per_request = math.ceil((PROMPT_TOKENS[size] + OUTPUT_TOKENS[size]) / BLOCK)  # pages at its end
    common = {"requests": REQUESTS, "prompt_tokens": PROMPT_TOKENS[size], "output_tokens": OUTPUT_TOKENS[size],
              "block_size": BLOCK, "pages_per_request": per_request}
    return [Setting("ample", "pool for all", {**common, "num_kv_blocks": REQUESTS * per_request + 4}),
            # holds two requests' peak and a bit: the others wait or are preempted
            Setting("small", "pool too small", {**common, "num_kv_blocks": 2 * per_request + 2})]


def run_setting(lab: Lab, setting: Setting) -> SettingResult:
    o = setting.options
    with lab.engine(num_kv_blocks=o["num_kv_blocks"], block_size=o["block_size"],
                    enable_prefix_caching=False) as (engine, events):
        text = engine.tokenizer.encode(LONG_TEXT * 2, add_special_tokens=False)
        jobs = [Job(f"request {i + 1}", text[i * 7:i * 7 + o["prompt_tokens"]],
                    SamplingParams(temperature=0, max_tokens=o["output_tokens"], ignore_eos=True))
                for i in range(o["requests"])]
        drive = lab.drive(engine, events, jobs)
    result = drive.setting_result(setting)
    t0 = drive.t0
    result.events = [{"request_id": e["request_id"], "step": e["step"], "t_s": e["ts"] - t0, "tokens": e["tokens"],
                      "pages": math.ceil(e["tokens"] / o["block_size"])}
                     for e in drive.events if e["type"] == "schedule.preempt"]
    result.metrics = metrics(result, o["num_kv_blocks"])
    return result


def metrics(r: SettingResult, blocks: int) -> dict:
    computed = {q.request_id: 0 for q in r.per_request}
    for s in r.steps:
        for b in s.batch:
            computed[b["request_id"]] = computed.get(b["request_id"], 0) + b["num_tokens"]
    # each request needs its prompt and all but its last token computed once; the rest is recompute
    recompute = {q.request_id: computed[q.request_id] - (q.prompt_tokens + q.output_tokens - 1) for q in r.per_request}
    latencies = [q.latency_s for q in r.per_request if q.latency_s is not None]
    return {"num_kv_blocks": blocks, "preemptions": len(r.events), "steps": len(r.steps),
            "recomputed_tokens": sum(recompute.values()), "recomputed_by_request": recompute,
            "lost_pages": sum(e["pages"] for e in r.events),
            "makespan_s": max((q.finish_s or 0) for q in r.per_request), "mean_latency_s": mean(latencies),
            "min_free_blocks": min((s.free_blocks for s in r.steps), default=blocks)}


EXPERIMENT = Experiment(
    name="kv_capacity", title="KV capacity: a pool too small",
    what="4 requests with a KV pool that holds them all and one too small: which request was preempted, when, "
         "and what recomputing it cost.",
    settings=settings, run_setting=run_setting, figures=lab_kv.figures, sentences=lab_kv.sentences,
    headline=[("num_kv_blocks", "KV pages"), ("preemptions", "preemptions"), ("lost_pages", "pages lost"),
              ("recomputed_tokens", "tokens recomputed"), ("steps", "engine steps"), ("makespan_s", "makespan (s)")])
