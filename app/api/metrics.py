"""GET /metrics in the Prometheus text format, with the figures vLLM users watch:
running/waiting requests, KV blocks, prefix-cache hit rate, speculative acceptance,
TTFT and per-token latency histograms, aborted requests. Every series has a `model`
label: one server may hold several engines."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from app.serving.engine_service import EngineService
from app.serving.served_models import ServedModels

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    total: float = 0.0
    n: int = 0

    def observe(self, seconds: float) -> None:
        for i, edge in enumerate(BUCKETS):
            if seconds <= edge:
                self.counts[i] += 1
        self.total += seconds
        self.n += 1

    def lines(self, name: str, label: str) -> list[str]:
        """label: 'model="x"' (the series' own labels, without braces)."""
        out = [f'{name}_bucket{{{label},le="{edge}"}} {c}' for edge, c in zip(BUCKETS, self.counts)]
        return out + [f'{name}_bucket{{{label},le="+Inf"}} {self.n}', f"{name}_sum{{{label}}} {self.total}",
                      f"{name}_count{{{label}}} {self.n}"]


class Metrics:
    """Fed with every streamed output of the service (all trace levels)."""

    def __init__(self) -> None:
        self.ttft = Histogram()
        self.per_token = Histogram()
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def on_output(self, item: dict) -> None:
        if item.get("type") != "output" or "t" not in item:
            return
        rid, t = item["request_id"], item["t"]
        with self._lock:
            if item.get("index") == 0:
                self.ttft.observe(t)
            elif rid in self._last:
                self.per_token.observe(max(0.0, t - self._last[rid]))
            self._last[rid] = t
            if item.get("finished"):
                self._last.pop(rid, None)

    def series(self, service: EngineService) -> tuple[list[tuple[str, str, str, float]], dict[str, list[str]]]:
        """-> ([(kind, name, help, value)], histogram lines) of one engine, labelled with its model
        (and its replica, one of several: --replicas)."""
        label = f'model="{_label(service.model_name)}"'
        if getattr(service, "replica", None) is not None:
            label += f',replica="{service.replica}"'
        load = service.engine.load()
        hit = load.prefix_hit_tokens / load.prefix_queried_tokens if load.prefix_queried_tokens else 0.0
        acc = load.spec_accepted / load.spec_proposed if load.spec_proposed else 0.0
        gauges = [
            ("tokentrace_requests_running", "requests being computed", load.running),
            ("tokentrace_requests_waiting", "requests queued for KV blocks or a batch slot", load.waiting),
            ("tokentrace_kv_blocks_used", "KV blocks referenced by live requests", load.blocks_used),
            ("tokentrace_kv_blocks_free", "KV blocks holding nothing", load.blocks_free),
            ("tokentrace_kv_blocks_cached", "unreferenced KV blocks kept for the prefix cache", load.blocks_cached),
            ("tokentrace_prefix_cache_hit_rate", "prompt tokens found in the prefix cache / looked up", hit),
            ("tokentrace_spec_acceptance_rate", "draft tokens accepted / proposed", acc),
        ]
        counters = [
            ("tokentrace_requests_aborted_total", "requests aborted (stop, disconnect)", load.aborted),
            ("tokentrace_generated_tokens_total", "tokens generated", load.generated_tokens),
            ("tokentrace_engine_steps_total", "engine steps (target forward passes)", load.target_passes),
        ]
        values = [("gauge", n, h, v) for n, h, v in gauges] + [("counter", n, h, v) for n, h, v in counters]
        with self._lock:
            hist = {name: h.lines(name, label) for name, h in zip(HISTOGRAMS, (self.ttft, self.per_token))}
        return [(k, f"{n}{{{label}}}", h, v) for k, n, h, v in values], hist


HISTOGRAMS = {"tokentrace_time_to_first_token_seconds": "time to first token",
              "tokentrace_time_per_output_token_seconds": "time between tokens"}


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(per_model: list[tuple[EngineService, Metrics]]) -> str:
    """Every engine's series, grouped by metric name (HELP and TYPE once per name)."""
    groups: dict[str, tuple[str, str, list[str]]] = {}
    hists: dict[str, list[str]] = {name: [] for name in HISTOGRAMS}
    for service, metrics in per_model:
        values, hist = metrics.series(service)
        for kind, series, help_, value in values:
            name = series.split("{")[0]
            groups.setdefault(name, (kind, help_, []))[2].append(f"{series} {value}")
        for name, lines in hist.items():
            hists[name] += lines
    lines = []
    for name, (kind, help_, series) in groups.items():
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", *series]
    for name, series in hists.items():
        lines += [f"# HELP {name} {HISTOGRAMS[name]}", f"# TYPE {name} histogram", *series]
    return "\n".join(lines) + "\n"


def add_metrics_route(api: FastAPI, served) -> list[Metrics]:
    per_model = []
    for service in (r for s in ServedModels.of(served) for r in getattr(s, "replicas", [s])):
        metrics = Metrics()
        service.output_listeners.append(metrics.on_output)
        per_model.append((service, metrics))

    @api.get("/metrics", response_class=PlainTextResponse)
    def prometheus() -> str:
        return render(per_model)
    return [m for _, m in per_model]
