"""Batching: static (a batch forms when the engine is empty and runs until its longest
request ends: no joins, the finished requests' slots idle) against continuous (a finished
request's slot is taken at the next step), on 8 requests of 8..256 output tokens in 4
slots, arriving together and then staggered."""
from __future__ import annotations

from engine import SamplingParams

from app.lab.experiment import Experiment, Setting, SettingResult
from app.lab.measure import mean, percentile
from app.lab.runner import Job, Lab
from app.lab.workloads import PROMPTS
from visualizers import lab_batching

SLOTS = 4
# in arrival order, fixed: the longest first, so each static batch holds one long request
LENGTHS = {"full": [256, 8, 16, 32, 160, 48, 64, 96], "ci": [128, 4, 8, 16, 80, 24, 32, 48]}
STAGGER = {"full": 12, "ci": 6}  # steps between arrivals


def settings(size: str) -> list[Setting]:
    out = []
    for arrival in ("together", "staggered"):
        for policy in ("static", "continuous"):
            out.append(Setting(f"{policy}-{arrival}", f"{policy}, {arrival}",
                               {"batching": policy, "max_num_seqs": SLOTS, "arrival": arrival,
                                "stagger_steps": STAGGER[size] if arrival == "staggered" else 0,
                                "output_tokens": LENGTHS[size]}))
    return out


def jobs(setting: Setting) -> list[Job]:
    o = setting.options
    return [Job(f"{n} tokens", PROMPTS[i % len(PROMPTS)],
                SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), arrive_step=i * o["stagger_steps"])
            for i, n in enumerate(o["output_tokens"])]


def run_setting(lab: Lab, setting: Setting) -> SettingResult:
    o = setting.options
    with lab.engine(batching=o["batching"], max_num_seqs=o["max_num_seqs"]) as (engine, events):
        drive = lab.drive(engine, events, jobs(setting))
    result = drive.setting_result(setting)
    result.metrics = metrics(result, o["max_num_seqs"])
    return result


def metrics(r: SettingResult, slots: int) -> dict:
    reqs, steps = r.per_request, r.steps
    latencies = [q.latency_s for q in reqs if q.latency_s is not None]
    busy = sum(len(s.batch) for s in steps)
    idle_waiting = sum(min(slots - len(s.batch), s.waiting) for s in steps)
    finish = max((q.finish_s for q in reqs if q.finish_s is not None), default=0.0)
    tokens = sum(q.output_tokens for q in reqs)
    return {"steps": len(steps), "makespan_s": finish - min(q.arrival_s for q in reqs),
            "mean_latency_s": mean(latencies), "p99_latency_s": percentile(latencies, 99),
            "occupancy": busy / (slots * len(steps)) if steps else 0.0,
            "idle_slot_steps": slots * len(steps) - busy, "idle_slot_steps_while_waiting": idle_waiting,
            "output_tokens": tokens, "tokens_per_s": tokens / finish if finish else None, "slots": slots}


EXPERIMENT = Experiment(
    name="batching", title="Static vs continuous batching",
    what="8 requests of 8 to 256 output tokens in 4 slots: a static batch waits for its longest "
         "request, continuous batching fills a freed slot at the next step.",
    settings=settings, run_setting=run_setting, figures=lab_batching.figures, sentences=lab_batching.sentences,
    headline=[("steps", "engine steps"), ("cpu_s", "CPU time (s)"), ("makespan_s", "makespan (s)"), ("mean_latency_s", "mean latency (s)"),
              ("p99_latency_s", "p99 latency (s)"), ("occupancy", "slot occupancy")])
