"""Prefix caching and routing: 2-4 replicas of the model (each its own engine and KV pool),
users whose requests share a few system prompts, and the three routers of the server's
`--replicas N --router POLICY` (Router, the same code): round-robin,
least-loaded and prefix-aware. A replica's prefix cache only pays when requests sharing a
system prompt land on it, so the router decides how much prefill the replicas compute.

The replicas step in turn, in lock step (tick t: every replica with work runs one step), and
requests arrive at fixed ticks: the routing decisions, the cache hits and the prefill tokens
are the same on every machine; the seconds are this machine's (and count the other replicas'
steps in between, as they share this process: TTFT in steps is exact)."""
from __future__ import annotations

import time
from contextlib import ExitStack

from engine import LLMEngine, SamplingParams

from app.lab.experiment import Experiment, Setting, SettingResult
from app.lab.measure import mean, percentile, request_records, step_records
from app.lab.runner import Lab
from app.lab.workloads import shuffled
from app.serving.router import POLICIES, EngineProbe, Router
from visualizers import lab_routing

SYSTEMS = (
    "You are the help desk of a city library. You answer questions about opening hours, borrowing books, "
    "renewing loans, reserving study rooms and using the public computers. Keep every answer short and polite, "
    "and point to the right desk when a question is not yours to answer.",
    "You are a cooking assistant for busy parents. You suggest quick dinners from what is in the fridge, "
    "give exact quantities for four people, warn about common allergens, and always say how long the recipe "
    "takes from start to finish.",
    "You are a patient mathematics tutor for secondary school. You never give the final answer at once: you "
    "ask what the student has tried, give one hint at a time, check each step, and end with a similar "
    "exercise to practise on.",
    "You are the travel planner of a small railway company. You plan journeys by train across the country, "
    "with connections, platform changes, the cheapest fares and the bicycle rules, and you mention delays "
    "announced for today.",
)
QUESTIONS = ("Hello! I have a question.", "Can you help me with something quick?", "What should I do first?",
             "Is it possible today?", "How long will it take?", "What do you recommend?", "Thanks, and one more?",
             "Could you explain that again?")
SIZES = {  # replicas, system prompts, users per prompt, answer lengths (in turn), ticks between arrivals
    "ci": dict(replicas=2, systems=3, users=4, max_tokens=[16, 2, 2, 3, 12, 1], stagger=1),
    "full": dict(replicas=3, systems=4, users=8, max_tokens=[48, 4, 6, 8, 32, 2], stagger=1),
}
NUM_KV_BLOCKS = 256  # per replica: every system prompt fits, so nothing is evicted and the router alone decides


def settings(size: str) -> list[Setting]:
    return [Setting(p, p, {"router": p, "num_kv_blocks": NUM_KV_BLOCKS, **SIZES[size]}) for p in POLICIES]


def workload(o: dict) -> list[tuple[int, list[dict], int]]:
    """(system prompt index, messages, answer length) in arrival order: every user of every
    prompt, shuffled with a fixed seed (the same order for every router). The answers' lengths
    differ, so the replicas' loads do and least-loaded is not round-robin."""
    users = [(k, u) for k in range(o["systems"]) for u in range(o["users"])]
    return [(k, [{"role": "system", "content": SYSTEMS[k]},
                 {"role": "user", "content": QUESTIONS[(u + k) % len(QUESTIONS)]}],
             o["max_tokens"][n % len(o["max_tokens"])])
            for n, (k, u) in enumerate(shuffled(users, seed=27))]


def run_setting(lab: Lab, setting: Setting) -> SettingResult:
    o = setting.options
    with ExitStack() as stack:
        built = []
        for i in range(o["replicas"]):
            lab.report(0, 1, f"building replica {i + 1} of {o['replicas']}")  # the bar moves with the requests
            built.append(stack.enter_context(lab.engine(num_kv_blocks=o["num_kv_blocks"])))
        engines, logs = [e for e, _ in built], [ev for _, ev in built]
        ran = drive(lab, engines, Router(o["router"]), workload(o), o)
        events = [e for log in logs for e in log]
        t0 = ran["t0"]
    result = SettingResult(setting, request_records(events, t0, ran["roles"], ran["arrival_steps"]),
                           step_records(events, t0), {})
    result.extra = {"replica_of": ran["replica_of"], "system_of": ran["system_of"], "routes": ran["routes"],
                    "ticks": ran["ticks"],  # the replicas' step numbers are their own: what each prefilled
                    "replica_prefill": [sum(s.prefill_tokens for s in step_records(log, t0)) for log in logs]}
    result.metrics = metrics(result, o)
    return result


def drive(lab: Lab, engines: list[LLMEngine], router: Router, jobs: list[tuple[int, list[dict], int]],
          o: dict) -> dict:
    """Arrivals every `stagger` ticks, routed as they arrive; each tick steps every busy
    replica once. What each step prefilled is kept per replica (step numbers are per engine)."""
    probes = [EngineProbe(e) for e in engines]
    out = {"roles": {}, "arrival_steps": {}, "replica_of": {}, "system_of": {}, "routes": [],
           "t0": time.perf_counter()}
    pending, tick, done = list(enumerate(jobs)), 0, 0
    cpu0 = time.process_time()
    try:
        while pending or any(e.has_unfinished_requests() for e in engines):
            lab.check()
            while pending and pending[0][0] * o["stagger"] <= tick:
                n, (k, messages, length) = pending.pop(0)
                route = router.choose(engines[0].tokenizer.encode_chat(messages), probes)
                engine = engines[route.replica]
                params = SamplingParams(temperature=0, max_tokens=length, ignore_eos=True)
                rid = engine.add_request(messages=messages, params=params, request_id=f"{router.policy}-{n}")
                out["roles"][rid], out["arrival_steps"][rid] = f"prompt {k + 1}", engine.step_count
                out["replica_of"][rid], out["system_of"][rid] = route.replica, k
                out["routes"].append({"request_id": rid, **route.as_dict()})
            for engine in engines:
                if engine.has_unfinished_requests():
                    done += sum(t.finished for t in engine.step())
            tick += 1
            lab.report(done, len(jobs), f"tick {tick}: {done} of {len(jobs)} requests done")
    finally:
        for engine in engines:  # cancelled: every page goes back before the engines are freed
            for rid in engine.live_requests():
                engine.abort(rid)
    out["ticks"] = tick
    lab.cpu_s += time.process_time() - cpu0  # every replica steps in this process
    return out


def metrics(r: SettingResult, o: dict) -> dict:
    reqs = r.per_request
    prompt = sum(q.prompt_tokens for q in reqs)
    cached = sum(q.cached_tokens for q in reqs)
    ttft = [q.ttft_s for q in reqs if q.ttft_s is not None]
    ttft_steps = [q.first_step - q.arrival_step for q in reqs if q.first_step is not None]
    counts = [list(r.extra["replica_of"].values()).count(i) for i in range(o["replicas"])]
    return {"replicas": o["replicas"], "requests": len(reqs), "prompt_tokens": prompt, "cached_tokens": cached,
            "hit_rate": cached / prompt if prompt else 0.0,
            "prefill_tokens": sum(s.prefill_tokens for s in r.steps),
            "mean_ttft_s": mean(ttft), "p99_ttft_s": percentile(ttft, 99), "mean_ttft_steps": mean(ttft_steps),
            "ticks": r.extra["ticks"], "requests_per_replica": counts,
            "max_requests_on_a_replica": max(counts) if counts else 0}


EXPERIMENT = Experiment(
    name="routing", title="Prefix caching and routing across replicas",
    what="2-4 replicas, users sharing a few system prompts: round-robin vs least-loaded vs prefix-aware "
         "routing: cache hit rate, prefill tokens computed, TTFT.",
    settings=settings, run_setting=run_setting, figures=lab_routing.figures, sentences=lab_routing.sentences,
    headline=[("hit_rate", "prefix hit rate"), ("prefill_tokens", "prefill tokens computed"),
              ("mean_ttft_s", "mean TTFT (s)"),
              ("p99_ttft_s", "p99 TTFT (s)"), ("max_requests_on_a_replica", "most requests on one replica")])
