"""The transformers, tracing and bandwidth sections again on a real pretrained checkpoint."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from benchmarks.bench.bandwidth import bandwidth_bound
from benchmarks.bench.context import Bench
from benchmarks.bench.tracing import tracing
from benchmarks.bench.vs_transformers import vs_transformers
from engine.checkpoint.catalog import CATALOG


def label(name: str) -> str:
    """A catalog name's model as the rows' sections name it: "SmolLM2-135M-Instruct"."""
    return CATALOG[name].title.split(" (")[0] if name in CATALOG else name


def real_model(b: Bench, name: str = "smollm2") -> None:
    """The transformers, tracing and bandwidth sections again on a real pretrained checkpoint (the
    catalog's SmolLM2-135M-Instruct GGUF: 30 layers, 9/3 heads, a 49k vocabulary), so the
    ratios are not only the embedded toy's."""
    real = Bench(Path(name), None, b.device, b.settings)
    vs_transformers(real)
    tracing(real)
    bandwidth_bound(real)
    b.rows += [replace(r, section=f"{label(name)}: {r.section}") for r in real.rows]
