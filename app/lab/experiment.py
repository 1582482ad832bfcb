"""The lab's contract: an Experiment runs a fixed, seeded workload on the real engine under
two or more Settings, one after another, and returns a Result whose numbers are read from
the engine's own trace events (app/lab/measure.py), never modelled. Every setting runs several
times, interleaved (app/lab/spread.py): a result carries each repeat's metrics and their spread.

    from app.lab import run
    result = run("batching", model=None, size="ci", progress=print, cancelled=lambda: False)
    result.to_json()          # the dict the page, the HTML export and the figures read

An experiment module (app/lab/<name>.py) defines `EXPERIMENT = Experiment(...)`; the registry
finds every such module in this package (app/lab/registry.py), so a new experiment is a new file.
"""
from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

SCHEMA = 1
SIZES = ("ci", "full")


@dataclass
class Setting:
    """One knob position: its key, what the page calls it, and the engine options and
    workload knobs it runs with (JSON values only, so a result says exactly what ran)."""
    name: str
    label: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestRecord:
    """One request of a setting's workload, measured from its trace (seconds from the
    setting's first arrival; steps are the engine's step numbers)."""
    request_id: str
    role: str  # the workload's name for it: "short", "long prompt", "copy", ...
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    arrival_step: int  # the engine step after which it was added
    first_step: int | None  # the step of its first token
    finish_step: int | None
    arrival_s: float
    first_token_s: float | None
    finish_s: float | None
    ttft_s: float | None
    latency_s: float | None  # arrival to its last token
    token_s: list[float]  # when each token left (the `token` events)
    gaps_s: list[float]  # between consecutive tokens
    preemptions: int
    finish_reason: str | None
    steps: list[int]  # the engine steps it was part of (a Gantt's bars)


@dataclass
class StepRecord:
    """One engine step (a `schedule.step` event)."""
    step: int
    start_s: float
    seconds: float  # schedule + forward + sample
    forward_s: float
    num_tokens: int
    prefill_tokens: int
    decode_tokens: int  # decode and verify positions
    batch: list[dict]  # {request_id, kind, num_tokens}
    running: int
    waiting: int
    free_blocks: int


@dataclass
class SettingResult:
    setting: Setting
    per_request: list[RequestRecord]  # in the workload's order
    steps: list[StepRecord]
    metrics: dict[str, Any]  # the headline numbers (the figures' bars, the sentences' numbers)
    events: list[dict] = field(default_factory=list)  # the experiment's own events kept whole (preempt, spec)
    extra: dict[str, Any] = field(default_factory=dict)  # what an experiment measures beyond steps and requests
    # every repeat's metrics, in the order they ran (per_request, steps, events: the first repeat's);
    # spread: each numeric metric's median, min, max over them (app/lab/spread.py); metrics: the medians
    repeats: list[dict[str, Any]] = field(default_factory=list)
    spread: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Result:
    experiment: str
    title: str
    model: str
    size: str
    settings: list[SettingResult]
    sentences: list[str] = field(default_factory=list)
    repeats: int = 1  # each setting's runs, interleaved
    cancelled: bool = False
    error: str | None = None
    started: str = ""
    seconds: float = 0.0
    machine: dict[str, Any] = field(default_factory=dict)
    schema: int = SCHEMA

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Progress:
    """What runs now: the page's bar and the terminal's read this."""
    experiment: str
    setting: str  # its label (and, where a setting runs more than once, "· repeat 2 of 5")
    setting_index: int
    num_settings: int
    done: int  # steps or requests done in this setting
    total: int
    what: str  # "request 3 of 8", "step 120"
    repeat: int = 0  # which repeat of every setting runs now (interleaved: all settings, then again)
    repeats: int = 1

    @property
    def fraction(self) -> float:
        inner = min(1.0, self.done / self.total) if self.total else 0.0
        runs = max(1, self.num_settings) * max(1, self.repeats)
        return min(1.0, (self.repeat * max(1, self.num_settings) + self.setting_index + inner) / runs)


class Cancelled(Exception):
    """The caller's `cancelled()` said stop: raised between steps, the engine is freed."""


@dataclass
class Experiment:
    """name: the CLI's and registry's key. settings(size), or settings(size, model) where what runs
    depends on the model → the settings, run one after another. run_setting(lab, setting) → a
    SettingResult (app/lab/runner.py's Lab builds and frees the engines and drives the workload).
    figures(result dict) → plotly figure dicts; sentences(result dict) → two or three sentences
    from the numbers (both pure, in visualizers/lab*.py)."""
    name: str
    title: str
    what: str  # one line: what it shows
    settings: Callable[..., list[Setting]]
    run_setting: Callable[..., SettingResult]
    figures: Callable[[dict, str], list[dict]]  # (result, lang)
    sentences: Callable[[dict, str], list[str]]  # (result, lang): in that language
    headline: list[tuple[str, str]] = field(default_factory=list)  # (metric key, label) for tables
    # after every setting ran (not when cancelled): metrics that compare settings (precision's agreement)
    compare: Callable[[list[SettingResult]], None] | None = None
    repeats: dict[str, int] | None = None  # by size: how often each setting runs (default spread.REPEATS)


def machine() -> dict[str, Any]:
    import os

    import torch  # the lab always loads the engine anyway
    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def started_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
