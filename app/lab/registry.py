"""The experiments: every module of this package that defines `EXPERIMENT`, found once."""
from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from app.lab.experiment import Experiment

_REGISTRY: dict[str, Experiment] = {}
NOT_EXPERIMENTS = {"experiment", "registry", "runner", "run_experiment", "measure", "export", "workloads", "spread",
                   "__main__"}
ORDER = ("batching", "chunked_prefill", "disaggregation", "routing", "speculation", "precision", "kv_capacity")


def register(experiment: Experiment) -> Experiment:
    _REGISTRY[experiment.name] = experiment
    return experiment


def _discover() -> None:
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):  # this package's folder
        if info.name in NOT_EXPERIMENTS or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"app.lab.{info.name}")
        found = getattr(module, "EXPERIMENT", None)
        if isinstance(found, Experiment) and found.name not in _REGISTRY:
            register(found)


def experiments() -> list[Experiment]:
    """Every experiment, in the README's order (others after, by name)."""
    if not _REGISTRY:
        _discover()
    rank = {n: i for i, n in enumerate(ORDER)}
    return sorted(_REGISTRY.values(), key=lambda e: (rank.get(e.name, len(ORDER)), e.name))


def get(name: str) -> Experiment:
    names = [e.name for e in experiments()]
    if name not in _REGISTRY:
        raise KeyError(f"no experiment {name!r}; choose one of {', '.join(names)}")
    return _REGISTRY[name]
