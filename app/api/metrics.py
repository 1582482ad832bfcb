"""GET /metrics in the Prometheus text format (prometheus_client), with the figures vLLM
users watch: running/waiting requests, KV blocks, prefix-cache hit rate, speculative
acceptance, TTFT and per-token latency histograms, aborted requests. Every series has a
`model` label (and `replica`, one of several): one server may hold several engines."""
from __future__ import annotations

import threading
from typing import Iterator

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from app.serving.engine_service import EngineService
from app.serving.served_models import ServedModels

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
HISTOGRAMS = {"tokentrace_time_to_first_token_seconds": "time to first token",
              "tokentrace_time_per_output_token_seconds": "time between tokens"}
GAUGES = {"tokentrace_requests_running": "requests being computed",
          "tokentrace_requests_waiting": "requests queued for KV blocks or a batch slot",
          "tokentrace_kv_blocks_used": "KV blocks referenced by live requests",
          "tokentrace_kv_blocks_free": "KV blocks holding nothing",
          "tokentrace_kv_blocks_cached": "unreferenced KV blocks kept for the prefix cache",
          "tokentrace_prefix_cache_hit_rate": "prompt tokens found in the prefix cache / looked up",
          "tokentrace_spec_acceptance_rate": "draft tokens accepted / proposed"}
COUNTERS = {"tokentrace_requests_aborted_total": "requests aborted (stop, disconnect)",
            "tokentrace_generated_tokens_total": "tokens generated",
            "tokentrace_engine_steps_total": "engine steps (target forward passes)"}


class Metrics:
    """One engine's latency histograms, fed with every streamed output of its service (all
    trace levels). The histograms belong to no registry: the collector labels them."""

    def __init__(self) -> None:
        self.ttft = Histogram("tokentrace_time_to_first_token_seconds", HISTOGRAMS[
            "tokentrace_time_to_first_token_seconds"], buckets=BUCKETS, registry=None)
        self.per_token = Histogram("tokentrace_time_per_output_token_seconds", HISTOGRAMS[
            "tokentrace_time_per_output_token_seconds"], buckets=BUCKETS, registry=None)
        self._last: dict[str, float] = {}  # request id -> the time of its last output
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


def labels_of(service: EngineService) -> dict[str, str]:
    labels = {"model": service.model_name}
    if getattr(service, "replica", None) is not None:
        labels["replica"] = str(service.replica)
    return labels


def values_of(service: EngineService) -> dict[str, float]:
    """The engine's gauges and counters now, by metric name."""
    load = service.engine.load()
    hit = load.prefix_hit_tokens / load.prefix_queried_tokens if load.prefix_queried_tokens else 0.0
    acc = load.spec_accepted / load.spec_proposed if load.spec_proposed else 0.0
    return {"tokentrace_requests_running": load.running, "tokentrace_requests_waiting": load.waiting,
            "tokentrace_kv_blocks_used": load.blocks_used, "tokentrace_kv_blocks_free": load.blocks_free,
            "tokentrace_kv_blocks_cached": load.blocks_cached, "tokentrace_prefix_cache_hit_rate": hit,
            "tokentrace_spec_acceptance_rate": acc, "tokentrace_requests_aborted_total": load.aborted,
            "tokentrace_generated_tokens_total": load.generated_tokens,
            "tokentrace_engine_steps_total": load.target_passes}


class EngineCollector(Collector):
    """Every engine's series, read when Prometheus scrapes (one family per metric name)."""

    def __init__(self, per_model: list[tuple[EngineService, Metrics]]) -> None:
        self.per_model = per_model

    def collect(self) -> Iterator[Metric]:
        now = [(labels_of(s), values_of(s), m) for s, m in self.per_model]
        for name, help_ in GAUGES.items():
            family = GaugeMetricFamily(name, help_)
            for labels, values, _ in now:
                family.add_sample(name, labels, values[name])
            yield family
        for name, help_ in COUNTERS.items():
            family = CounterMetricFamily(name, help_)  # the family drops "_total"; its sample keeps it
            for labels, values, _ in now:
                family.add_sample(name, labels, values[name])
            yield family
        for name, help_ in HISTOGRAMS.items():
            family = HistogramMetricFamily(name, help_)
            for labels, _, metrics in now:
                histogram = metrics.ttft if name.endswith("first_token_seconds") else metrics.per_token
                for sample in next(iter(histogram.collect())).samples:
                    if not sample.name.endswith("_created"):
                        family.add_sample(sample.name, {**labels, **sample.labels}, sample.value)
            yield family


def add_metrics_route(api: FastAPI, served) -> list[Metrics]:
    per_model = []
    for service in (r for s in ServedModels.of(served) for r in getattr(s, "replicas", [s])):
        metrics = Metrics()
        service.output_listeners.append(metrics.on_output)
        per_model.append((service, metrics))
    registry = CollectorRegistry(auto_describe=False)  # this server's own: several apps share a test process
    registry.register(EngineCollector(per_model))

    @api.get("/metrics", response_class=Response)
    def prometheus() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
    return [m for _, m in per_model]
