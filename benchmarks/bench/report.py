"""The printed table and the JSON record (with the machine description)."""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from benchmarks.bench.context import Row


def print_table(rows: list[Row]) -> None:
    section = None
    print(f"\n{'benchmark':<52} {'value':>12} {'baseline':>12} {'ratio':>7}  note")
    for r in rows:
        if r.section != section:
            section = r.section
            print(f"-- {section}")
        base = f"{r.baseline:12.2f}" if r.baseline is not None else " " * 12
        ratio = f"{r.ratio:6.2f}x" if r.ratio is not None else " " * 7
        print(f"  {r.name:<50} {r.value:12.2f} {base} {ratio}  {r.unit} {r.note}".rstrip())


def write_record(out: Path, rows: list[Row], **run: object) -> Path:
    """benchmarks/results/bench-<time>.json: the machine, the run's description, the rows."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"machine": machine(), **run,
                                "rows": [dict(r.__dict__, ratio=r.ratio) for r in rows]}, indent=2))
    return path


def machine() -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "cpu": cpu_model(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "load_average": os.getloadavg()}  # at the end of the run: other work on a shared machine
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return info


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
