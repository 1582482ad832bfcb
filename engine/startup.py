"""What an engine settles before it loads a model: the device, the dtype, and the
collector's view of the heap that start-up leaves behind."""
from __future__ import annotations

import atexit
import gc

import torch

from engine.config import DTYPES

_heap_frozen = False
# young collections at most every this many new container objects (CPython's 700): a `full` trace's
# step allocates ~150 small lists and dicts, and each young collection, run cold after a pass,
# cost more than the objects it scanned: 20,000 made the embedded MoE's traced stream 2-3% faster
# at batch 1, untraced unchanged (2026-12-07)
YOUNG_THRESHOLD = 20_000


def freeze_startup_heap() -> None:
    """Once per process, when the first engine is built: move every object alive then
    (the modules of torch, transformers and the caller's imports, ~300k objects, and that
    engine) into the collector's permanent generation. A traced step allocates ~150 small
    lists and dicts that the trace keeps, so full collections come often, and each walked
    that whole static heap (on CPU, several % of decode time at capture level `full`). vLLM
    freezes its startup heap the same way. The cost: that first engine, if dropped, is
    freed only at exit (its reference cycles are never collected). Unfrozen at exit, so
    shutdown collects as usual. The young generation's threshold is raised too (YOUNG_THRESHOLD)."""
    global _heap_frozen
    if not _heap_frozen:
        _heap_frozen = True
        gc.collect()
        gc.freeze()
        atexit.register(gc.unfreeze)
        young, *older = gc.get_threshold()
        gc.set_threshold(max(young, YOUNG_THRESHOLD), *older)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but no CUDA GPU is available")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {device!r} (cpu or cuda)")
    return dev


def resolve_dtype(dtype: str | torch.dtype, checkpoint_dtype: str | None, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":  # the checkpoint's own dtype on GPU; float32 on CPU (fast and exact there)
        return DTYPES.get(checkpoint_dtype or "", torch.bfloat16) if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]
