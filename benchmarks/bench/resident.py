"""Resident memory a model's load adds to a process, against what it must hold: the
weights' own bytes plus the KV pool. Measured in a fresh process each (one engine loaded
after another would share, and not give back, the first one's pages).

    python -m benchmarks.bench.resident smollm2 bfloat16      # prints one JSON line
"""
from __future__ import annotations

import json
import subprocess
import sys

import torch

from engine import llm_engine
from engine.checkpoint.resolve import resolve_model_path


def rss_bytes(field: str = "VmRSS") -> int:
    """This process's resident set now (VmRSS), or its anonymous part (RssAnon: the heap and
    mappings of no file, where the weights, the KV pool and the tables live), in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def measure(model: str, dtype: str) -> dict:
    """Load `model` at `dtype` on the CPU in this process: RSS growth across the engine's
    construction, with its tokenizer built before the baseline (Gemma 3's 262k-token
    vocabulary alone holds ~320 MB: not the model's weights), against the engine's own count
    of its weights and KV pool, and the RoPE tables beside them (cos and sin for the first 4,096
    positions until a pass reaches further: Gemma 3's two tables, 16 MiB). The anonymous part
    of the growth leaves out the shared libraries' code pages that PyTorch touches on first use
    during a load (libtriton.so, ~66 MB): file pages any process shares, not the model's data."""
    torch.zeros(1) @ torch.zeros(1)  # the runtime's first-use allocations, before the baseline
    tokenizer = llm_engine.Tokenizer(resolve_model_path(model))
    llm_engine.Tokenizer = lambda path: tokenizer  # the engine takes the one built here
    before, anon_before = rss_bytes(), rss_bytes("RssAnon")
    engine = llm_engine.LLMEngine(model, device="cpu", dtype=dtype)
    growth, anon = rss_bytes() - before, rss_bytes("RssAnon") - anon_before
    info = engine.describe()
    inner = engine.runner.model.model
    rope = sum(t.numel() * t.element_size() for r in (inner.rotary, inner.rotary_local) if r is not None
               for t in (r.cos, r.sin))
    need = info.model.weights_bytes + info.kv_pool.bytes
    return {"model": model, "dtype": dtype, "rss_growth": growth, "anon_growth": anon,
            "weights": info.model.weights_bytes, "kv_pool": info.kv_pool.bytes, "rope_tables": rope,
            "ratio": growth / need, "ratio_anon": anon / need, "ratio_with_rope": growth / (need + rope)}


def in_subprocess(model: str, dtype: str, timeout: float = 600) -> dict:
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench.resident", model, dtype],
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"resident {model} {dtype} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], sys.argv[2])))
