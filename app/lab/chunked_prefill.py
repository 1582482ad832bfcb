"""Chunked prefill: 4 streams are decoding when a long prompt arrives. Without chunking its
whole prefill is one step, and every stream waits for it; chunked at 512 or 128 tokens,
the prefill shares each step with the streams' decodes: their stalls shrink, and the long
prompt's first token comes later."""
from __future__ import annotations

from engine import SamplingParams

from app.lab.experiment import Experiment, Setting, SettingResult
from app.lab.measure import percentile
from app.lab.runner import Job, Lab
from app.lab.workloads import PROMPTS, long_prompt
from visualizers import lab_chunked

STREAMS = 4
LONG_TOKENS = {"full": 2048, "ci": 600}  # at most the model's context (less the answer)
STREAM_TOKENS = {"full": 96, "ci": 24}
ARRIVE_STEP = {"full": 12, "ci": 6}  # the streams are decoding by then
LONG_ANSWER = 8


def settings(size: str) -> list[Setting]:
    common = {"streams": STREAMS, "long_prompt_tokens": LONG_TOKENS[size], "stream_tokens": STREAM_TOKENS[size],
              "arrive_step": ARRIVE_STEP[size]}
    return [Setting("off", "no chunking", {**common, "chunk": None}),
            Setting("512", "chunks of 512", {**common, "chunk": 512}),
            Setting("128", "chunks of 128", {**common, "chunk": 128})]


def run_setting(lab: Lab, setting: Setting) -> SettingResult:
    o = setting.options
    # "no chunking": a step budget that holds the whole prompt and the streams' decodes
    budget = o["chunk"] or 1 << 16
    with lab.engine(max_num_batched_tokens=budget, enable_prefix_caching=False) as (engine, events):
        n = min(o["long_prompt_tokens"], engine.max_model_len - LONG_ANSWER - 1)
        jobs = [Job("stream", PROMPTS[i], SamplingParams(temperature=0, max_tokens=o["stream_tokens"],
                                                         ignore_eos=True)) for i in range(o["streams"])]
        jobs.append(Job("long prompt", long_prompt(engine.tokenizer, n),
                        SamplingParams(temperature=0, max_tokens=LONG_ANSWER, ignore_eos=True),
                        arrive_step=o["arrive_step"]))
        drive = lab.drive(engine, events, jobs)
    result = drive.setting_result(setting)
    result.metrics = metrics(result, budget)
    return result


def metrics(r: SettingResult, budget: int) -> dict:
    streams = [q for q in r.per_request if q.role == "stream"]
    long = next(q for q in r.per_request if q.role == "long prompt")
    # the gaps of the streams while the long prompt was being prefilled (its arrival to its first token)
    window = [g for q in streams for t, g in zip(q.token_s[1:], q.gaps_s)
              if long.first_token_s is not None and long.arrival_s <= t <= long.first_token_s + g]
    gaps = [g for q in streams for g in q.gaps_s]
    prefill_steps = [s for s in r.steps if any(b["request_id"] == long.request_id and b["kind"] == "prefill"
                                               for b in s.batch)]
    return {"long_prompt_tokens": long.prompt_tokens, "long_ttft_s": long.ttft_s,
            "gap_p50_s": percentile(gaps, 50), "gap_p99_s": percentile(gaps, 99),
            "longest_stall_s": max(gaps) if gaps else None,
            "gap_p50_during_prefill_s": percentile(window, 50),
            "max_prefill_tokens_per_step": max((s.prefill_tokens for s in r.steps), default=0),
            # the biggest step a stream's next token waited on, in tokens: deterministic, unlike the stall
            "max_step_tokens_with_streams": max((s.num_tokens for s in r.steps
                                                 if any(b["request_id"] in {q.request_id for q in streams}
                                                        for b in s.batch)), default=0),
            "long_prefill_steps": len(prefill_steps), "step_budget": budget, "steps": len(r.steps)}


EXPERIMENT = Experiment(
    name="chunked_prefill", title="Chunked prefill: decoding streams against a long prompt",
    what="4 streams decode while a long prompt arrives: chunking off, 512 and 128 tokens a step; the streams' "
         "gaps between tokens against the long prompt's time to first token.",
    settings=settings, run_setting=run_setting, figures=lab_chunked.figures, sentences=lab_chunked.sentences,
    headline=[("long_prompt_tokens", "long prompt (tokens)"), ("max_prefill_tokens_per_step", "most prefilled in a step"),
              ("max_step_tokens_with_streams", "biggest step a stream waited on (tokens)"),
              ("gap_p50_s", "gap p50 (s)"), ("gap_p99_s", "gap p99 (s)"), ("longest_stall_s", "longest stall (s)"),
              ("long_ttft_s", "long prompt TTFT (s)")])
