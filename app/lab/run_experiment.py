"""Running an experiment: its settings one after another, each several times, interleaved
(every setting once, then every setting again), the engines freed between them; the
figures' medians and spread, then the experiment's comparison and sentences. One setting's
run is the runner's Lab. Apart from the runner so that the experiments, which use the
runner, are found by the registry without a circle (registry -> experiment -> runner)."""
from __future__ import annotations

import gc
import inspect
import os
import time
from typing import Callable

import torch

from app.lab.experiment import Cancelled, Result, Setting, SettingResult, SIZES, machine, started_now
from app.lab.registry import get
from app.lab.runner import Lab, ProgressFn
from app.lab.spread import REPEATS, medians, spread


def release_memory(thaw: bool = True) -> None:
    """Collect the engines no one holds (an engine's parts refer to each other: only the
    collector frees them) and hand CUDA's cached blocks back. The process's first engine froze
    the heap, itself inside (LLMEngine's start-up: no collection walks it again): thaw=True thaws
    it for this one collection, so the first engine an experiment builds (the CLI's) is freed too.
    thaw=False: the engines built since only (a walk of the whole heap, imports and all, can
    take longer than a repeat of a ci workload)."""
    frozen = thaw and gc.get_freeze_count() > 0
    if frozen:
        gc.unfreeze()
    gc.collect()
    if frozen:
        gc.freeze()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def quiet_threads() -> int:
    """torch's threads as set, or 1 while the load average is above the cores."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return 1 if load > (os.cpu_count() or 1) else torch.get_num_threads()


def run(name: str, model: str | None = None, size: str = "ci", progress: ProgressFn | None = None,
        cancelled: Callable[[], bool] | None = None, device: str = "auto", repeats: int | None = None,
        settings: list[Setting] | None = None, threads: int | None = None) -> Result:
    """Run one experiment's settings, each `repeats` times (default: the experiment's for this size,
    else spread.REPEATS), interleaved: every setting once, then every setting again. settings: these
    instead of the experiment's (two copies of one arm: what "no difference" looks like). threads:
    torch's for the run (given back after); default: as set, or 1 where the machine is busier than its
    cores (spinning OpenMP threads on a loaded machine run steps far slower and noisier).
    Cancelled: what ran so far, cancelled=True; a setting that failed (a model that does not load):
    what ran so far and `error` saying why. The sentences are generated from the measured numbers."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    exp = get(name)
    lab = Lab(name, model, size, device, progress, cancelled)
    if settings is None:  # settings(size), or settings(size, model) where what runs depends on the model
        takes_model = len(inspect.signature(exp.settings).parameters) > 1
        settings = exp.settings(size, model) if takes_model else exp.settings(size)
    lab.num_settings = len(settings)
    lab.repeats = max(1, repeats or (exp.repeats or REPEATS).get(size, 1))
    before = torch.get_num_threads()
    torch.set_num_threads(threads or quiet_threads())
    result = Result(exp.name, exp.title, model or "embedded", size, [], started=started_now(), machine=machine(),
                    repeats=lab.repeats)
    firsts: list[SettingResult] = []
    t = time.perf_counter()
    try:
        for r in range(lab.repeats):
            lab.repeat = r
            for i, setting in enumerate(settings):
                lab.setting, lab.setting_index = setting, i
                lab.report(0, 1, "building the engine")
                lab.cpu_s = 0.0
                ran = exp.run_setting(lab, setting)
                # the work in CPU seconds: on a busy machine the wall clock adds the waits for a core
                ran.metrics.setdefault("cpu_s", lab.cpu_s)
                if r == 0:
                    firsts.append(ran)  # its steps, requests and events are the ones the figures draw
                firsts[i].repeats.append(ran.metrics)
                del ran
                # the setting's engine, now unreferenced, goes before the next one is built; the whole
                # heap is walked once, after the first (the process's first engine may be frozen in it)
                release_memory(thaw=r == 0 and i == 0)
    except Cancelled:
        result.cancelled = True
    except (ValueError, RuntimeError, OSError) as e:  # a model that does not load, a setting it cannot run
        result.error = f"{type(e).__name__}: {e}"
    finally:
        release_memory(thaw=False)
        torch.set_num_threads(before)
    for s in firsts:
        s.spread = spread(s.repeats)
        s.metrics = medians(s.repeats[0], s.spread)
    result.settings = firsts
    result.seconds = time.perf_counter() - t
    result.machine["load_average_end"] = machine().get("load_average")  # the timings' noise: was the machine busy
    if not result.cancelled and not result.error and exp.compare is not None:
        exp.compare(result.settings)
    if not result.cancelled and not result.error:
        result.sentences = exp.sentences(result.to_json())
    return result
