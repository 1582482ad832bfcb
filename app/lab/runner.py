"""One setting of an experiment (Lab): build its engine, drive its workload step by step
(arrivals at fixed steps, so the workload is the same on any machine), keep the trace
events, free the engine; progress after every step, cancel checked before every step."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from engine import DisaggEngine, Engine, EngineConfig, LLMEngine, SamplingParams, TokenOutput, TraceEvent, Tracer

from app.lab.experiment import Cancelled, Progress, Setting, SettingResult
from app.lab.measure import KEPT_EVENTS, request_records, step_records

ProgressFn = Callable[[Progress], None]


@dataclass
class Job:
    """One request of a workload: added once the driver has run `arrive_step` steps, or, with
    `after` = (role, n), once the workload's requests of that role have emitted n tokens together
    (an arrival tied to the work done, not to steps: a disaggregated engine's steps are not a
    colocated one's)."""
    role: str
    prompt: str | list[int]
    params: SamplingParams
    arrive_step: int = 0
    options: dict[str, Any] = field(default_factory=dict)  # add_request's speculative= etc.
    after: tuple[str, int] | None = None


@dataclass
class Drive:
    """What one workload's run left: the kept events (dicts), its requests' ids by role order."""
    events: list[dict]
    roles: dict[str, str]  # request id → role
    arrival_steps: dict[str, int]
    t0: float
    steps_run: int
    cpu_s: float = 0.0  # this process's CPU time over the drive: the work, less the waits of a busy machine

    def setting_result(self, setting: Setting, metrics: dict | None = None) -> SettingResult:
        steps = step_records(self.events, self.t0)
        requests = request_records(self.events, self.t0, self.roles, self.arrival_steps)
        return SettingResult(setting, requests, steps, metrics or {})


class Lab:
    """One experiment's run: the model, the size, the callbacks. Experiments build their
    engines with `engine()` (freed when the block ends) and run workloads with `drive()`."""

    def __init__(self, experiment: str, model: str | None, size: str, device: str,
                 progress: ProgressFn | None, cancelled: Callable[[], bool] | None) -> None:
        self.experiment, self.model, self.size, self.device = experiment, model, size, device
        self._progress = progress
        self._cancelled = cancelled
        self.setting: Setting | None = None
        self.setting_index = 0
        self.num_settings = 1
        self.repeat, self.repeats = 0, 1
        self.cpu_s = 0.0  # this process's CPU time in the setting's drives (run() adds it to the metrics)
        self.last_events: list[dict] = []  # the last drive's kept events (tests check figures against them)

    def check(self) -> None:
        if self._cancelled is not None and self._cancelled():
            raise Cancelled(self.experiment)

    def report(self, done: int, total: int, what: str) -> None:
        if self._progress is not None and self.setting is not None:
            label = self.setting.label
            if self.repeats > 1:
                label += f" · repeat {self.repeat + 1} of {self.repeats}"
            self._progress(Progress(self.experiment, label, self.setting_index, self.num_settings,
                                    done, total, what, self.repeat, self.repeats))

    @contextmanager
    def engine(self, model: str | None = None, *, trace: bool = True, dtype: str = "auto",
               device: str | None = None, disaggregate: bool = False,
               **options: Any) -> Iterator[tuple[Engine, list[dict]]]:
        """An engine for one setting and the list its kept trace events go to. options: the
        EngineConfig fields, and draft / num_speculative_tokens / prompt_lookup_*. disaggregate:
        a DisaggEngine (its prefill engine in a process of its own, stopped when the block ends)."""
        keys = ("draft", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")
        engine_kw = {k: options.pop(k) for k in keys if k in options}
        events: list[dict] = []

        def keep(event: TraceEvent) -> None:
            if event.type in KEPT_EVENTS:
                events.append(event.to_dict())

        self.check()
        threads = torch.get_num_threads()  # a DisaggEngine takes half the cores for this process: given back after
        build = DisaggEngine if disaggregate else LLMEngine
        try:
            engine = build(model if model is not None else self.model, device=device or self.device, dtype=dtype,
                           config=EngineConfig(**options), tracer=Tracer(keep) if trace else None,
                           trace_level="basic" if trace else "off", **engine_kw)
            try:
                warm_up(engine)
                events.clear()
                yield engine, events
            finally:
                free(engine)
                del engine
        finally:
            torch.set_num_threads(threads)

    def drive(self, engine: Engine, events: list[dict], jobs: list[Job], max_steps: int = 100_000,
              on_output: Callable[[str, TokenOutput], None] | None = None, one_at_a_time: bool = False) -> Drive:
        """Run jobs to the end; abort what is left if cancelled (the engine's pages go back).
        one_at_a_time: each job waits for the one before to end (its arrive_step is ignored)."""
        pending = sorted(jobs, key=lambda j: (j.arrive_step, j.after[1] if j.after else 0))
        roles: dict[str, str] = {}
        arrivals: dict[str, int] = {}
        emitted: dict[str, int] = {}  # tokens out so far, by role (the `after` arrivals)
        start = len(events)
        t0, cpu0 = time.perf_counter(), time.process_time()
        steps = finished = 0
        now: set[int] = set()  # `after` jobs due at once: nothing runs that could emit their tokens

        def due(job: Job) -> bool:
            if one_at_a_time:
                return not engine.has_unfinished_requests()
            if job.after is not None and id(job) not in now:
                return emitted.get(job.after[0], 0) >= job.after[1]
            return job.arrive_step <= steps

        try:
            while pending or engine.has_unfinished_requests():
                self.check()
                while pending and due(pending[0]):
                    job = pending.pop(0)
                    rid = engine.add_request(job.prompt, job.params, **job.options)
                    roles[rid], arrivals[rid] = job.role, engine.step_count
                if not engine.has_unfinished_requests():  # idle until the next arrival: no step to run
                    if pending[0].after is not None:
                        now.add(id(pending[0]))
                    steps = max(steps, pending[0].arrive_step)
                    continue
                for out in engine.step():
                    finished += out.finished
                    if out.request_id in roles and out.token_id >= 0:
                        emitted[roles[out.request_id]] = emitted.get(roles[out.request_id], 0) + 1
                    if on_output is not None and out.request_id in roles:
                        on_output(roles[out.request_id], out)
                steps += 1
                if steps > max_steps:
                    raise RuntimeError(f"the workload did not finish in {max_steps} steps")
                self.report(finished, len(jobs), f"step {steps}, {finished} of {len(jobs)} requests done")
        finally:
            for rid in roles:
                engine.abort(rid)
                engine.release(rid)
        self.last_events = events[start:]
        cpu = time.process_time() - cpu0
        self.cpu_s += cpu
        return Drive(self.last_events, roles, arrivals, t0, steps, cpu)


def warm_up(engine: Engine) -> None:
    """One short request first, so the setting's first step does not pay for torch's lazy set-up."""
    rid = engine.add_request("Hello", SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), trace_level="off")
    try:
        while engine.get_output(rid).finish_reason is None:
            engine.step()
    finally:
        engine.abort(rid)
        engine.release(rid)


def free(engine: Engine) -> None:
    """Stop the engine's workers; its memory goes at the caller's next release_memory(), once
    nothing holds the engine (a collection here, with the engine still referenced, freed nothing)."""
    engine.shutdown()
